package keyring

import (
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// readNoAtime reads a file without moving its access time (O_NOATIME: the file is root's, and so
// is the writer), bounded by MaxFile.
func readNoAtime(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOATIME, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()

	return readlimit.Reader(f, MaxFile, path)
}

// accessTime is a file's atime.
func accessTime(st fs.FileInfo) time.Time {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return time.Unix(s.Atim.Sec, s.Atim.Nsec).UTC()
	}

	return time.Time{}
}
