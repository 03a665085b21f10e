package holder

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// A process identity names one process uniquely on a machine: the kernel's boot id, the PID
// namespace's inode (two containers with the same host name have their own pid 1, 2, …), and
// the process's start time in clock ticks since boot (a pid reused later starts later). It is
// written "BOOT.PIDNS.START" (BOOT: the boot id's first 12 hex digits).
var procFormat = regexp.MustCompile(`^([0-9a-f]{12})\.([0-9]+)\.([0-9]+)$`)

// Space is where pids mean the same process: "BOOT.PIDNS" of this process ("" where /proc
// cannot tell).
func Space() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}

	b := strings.ReplaceAll(strings.TrimSpace(string(boot)), "-", "")
	if len(b) < 12 {
		return ""
	}

	ns, err := os.Readlink("/proc/self/ns/pid") // "pid:[4026531836]"
	if err != nil {
		return ""
	}

	inode := strings.TrimSuffix(strings.TrimPrefix(ns, "pid:["), "]")
	if _, err := strconv.ParseUint(inode, 10, 64); err != nil {
		return ""
	}

	return b[:12] + "." + inode
}

// Start is when process pid of this PID namespace started, in clock ticks since boot; ok is
// false when no such process exists.
func Start(pid int) (start string, ok bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}

	// pid (comm) state ppid … : fields after the last ')' (comm may hold anything).
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return "", false
	}

	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 { // starttime is field 22 of stat, the 20th after comm
		return "", false
	}

	return fields[19], true
}

// Process is this process's identity ("" where /proc cannot tell).
func Process() string {
	space := Space()
	start, ok := Start(os.Getpid())

	if space == "" || !ok {
		return ""
	}

	return space + "." + start
}

// ProcessParts splits a process identity into its PID space and start time.
func ProcessParts(proc string) (space, start string, ok bool) {
	m := procFormat.FindStringSubmatch(proc)
	if m == nil {
		return "", "", false
	}

	return m[1] + "." + m[2], m[3], true
}
