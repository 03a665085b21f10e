package liveness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/ghcrsync/ghcrsync/internal/holder"
)

// Local judges a holder from this machine: the process its id names has exited, so its run is
// over (a cancelled CI step's `ghcrsync release` on the same runner needs no --holder).
//
// The evidence is Unique only when the id carries a process identity (holder.Process) from this
// PID space — the same kernel boot and PID namespace — and no process with that pid and start
// time exists. A host name and pid alone are no proof: a container with the host's UTS
// namespace, or the host seen from a container, shares the name but not the pids, and a pid is
// reused. Such evidence (an id of an older ghcrsync) is reported, not Unique: the caller accepts
// it only where no live Lease vouches for the holder. An id from another PID space, another
// host, or whose process still runs is not judged: there is no evidence either way.
type Local struct{}

// Check reports a terminated run when id's process, on this machine, no longer exists.
func (Local) Check(_ context.Context, id holder.ID) (Verdict, error) {
	host, _ := os.Hostname()
	if id.PID <= 0 {
		return Verdict{}, nil
	}

	if space, start, ok := holder.ProcessParts(id.Proc); ok {
		if space != holder.Space() {
			return Verdict{Evidence: fmt.Sprintf("process %d ran in another PID namespace or boot than this one: no evidence here", id.PID)}, nil
		}

		if now, running := holder.Start(id.PID); running && now == start {
			return Verdict{Evidence: fmt.Sprintf("process %d (started at tick %s) is running in this PID namespace", id.PID, start)}, nil
		}

		return Verdict{Applicable: true, Terminal: true, Unique: true,
			Evidence: fmt.Sprintf("process %d (started at tick %s) of this PID namespace and boot has exited", id.PID, start)}, nil
	}

	if id.Host == "" || id.Host != host {
		return Verdict{}, nil
	}

	if err := syscall.Kill(id.PID, 0); errors.Is(err, syscall.ESRCH) {
		return Verdict{Applicable: true, Terminal: true,
			Evidence: fmt.Sprintf("no process %d on a host named %s (the id names no PID namespace: another one may share the name)", id.PID, host)}, nil
	}

	return Verdict{Evidence: fmt.Sprintf("process %d on this host (%s) is running", id.PID, host)}, nil
}
