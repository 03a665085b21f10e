package liveness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/ghcrsync/ghcrsync/internal/holder"
)

// Local judges a holder from this host: the process its id names has exited, so its run is over
// (a cancelled CI step's `ghcrsync release` on the same runner needs no --holder). A holder on
// another host, or whose process still runs (it may be another process reusing the pid), is
// not judged: there is no evidence either way.
type Local struct{}

// Check reports a terminated run when id was made on this host by a process that no longer exists.
func (Local) Check(_ context.Context, id holder.ID) (Verdict, error) {
	host, _ := os.Hostname()
	if id.Host == "" || id.Host != host || id.PID <= 0 {
		return Verdict{}, nil
	}

	if err := syscall.Kill(id.PID, 0); errors.Is(err, syscall.ESRCH) {
		return Verdict{Applicable: true, Terminal: true, Evidence: fmt.Sprintf("process %d on this host (%s) has exited", id.PID, host)}, nil
	}

	return Verdict{Evidence: fmt.Sprintf("process %d on this host (%s) is running", id.PID, host)}, nil
}
