// Package readlimit reads files and bodies with a ceiling: ghcrsync never reads an input of
// unbounded size into memory (a plan, a state, a configuration, a SOPS file, an API answer).
package readlimit

import (
	"fmt"
	"io"
	"os"
)

// Ceilings of the inputs ghcrsync reads.
const (
	Config      = 1 << 20  // ghcrsync.hcl
	SOPSFile    = 4 << 20  // the encrypted credential
	Plan        = 64 << 20 // a saved plan (a 10,000-node plan is ~10 MiB)
	State       = 64 << 20 // a local state file
	Talosconf   = 4 << 20  // a talosconfig
	Body        = 1 << 20  // an HTTP answer from the registry or the CI API
	StepSummary = 1 << 20  // GitHub Actions keeps 1 MiB of a step's summary
)

// TooLargeError is an input over its ceiling.
type TooLargeError struct {
	What  string
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than %s, more than any genuine one: not reading it", e.What, size(e.Limit))
}

func size(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}

	return fmt.Sprintf("%d KiB", n>>10)
}

// File reads path, refusing a file larger than limit bytes. Errors are os.ReadFile's (so
// errors.Is(err, fs.ErrNotExist) works) or a *TooLargeError.
func File(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()

	return Reader(f, limit, path)
}

// Reader reads r to its end, refusing more than limit bytes; what names the input in the error.
func Reader(r io.Reader, limit int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}

	if int64(len(b)) > limit {
		return nil, &TooLargeError{What: what, Limit: limit}
	}

	return b, nil
}
