package main

import "syscall"

// maxRSS is the peak resident memory getrusage reports: bytes on macOS.
func maxRSS(ru syscall.Rusage) int64 { return ru.Maxrss }
