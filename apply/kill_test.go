package apply_test

import "os"

// killHelper is re-entered in a child process by the kill -9 tests (see lease_test.go).
func killHelper() bool { return os.Getenv("GHCRSYNC_KILL_AT") != "" && runKillHelper() }
