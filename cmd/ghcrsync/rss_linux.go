package main

import "syscall"

// maxRSS is the peak resident memory getrusage reports: kilobytes on Linux.
func maxRSS(ru syscall.Rusage) int64 { return int64(ru.Maxrss) * 1024 }
