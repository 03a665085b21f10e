package main

import (
	"errors"
	"strconv"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/lease"
	"github.com/ghcrsync/ghcrsync/plan"
)

// The exit codes, one table (docs/ci.md). A signal that cancelled the command exits 128 + its
// number: 130 (SIGINT), 143 (SIGTERM).
const (
	exitOK          = 0 // done; plan: no changes
	exitFailure     = 1 // an error: bad input, an unreachable cluster, a missing permission…
	exitChanges     = 2 // plan --detailed-exitcode: changes present; fences --exit-code: fences held; fmt --check: a file is not formatted
	exitRefusedPlan = 3 // the saved plan is stale, not authentic, damaged or of another format; plan: the credential pulls an image it must not (credential.deny)
	exitLeaseHeld   = 4 // the run Lease is held by another run
	exitPartial     = 5 // not done: a node or secret failed, a fence is still held, or the old credential is still used (the verdict names it)
	exitProgressed  = 6 // apply: stopped on its time budget with nothing failed: it did what fitted, the next run continues
)

// Each command's exit status from its result: the one place a result becomes a code.

// planStatus: with --detailed-exitcode, 2 when the plan has changes or something still uses the
// old credential ("no changes", 0, only when nothing uses it either: a scheduled plan then says
// when revoking has become safe).
func planStatus(p *plan.Plan, detailed bool) error {
	if detailed && (p.Changes() || !p.SafeToRevoke()) {
		return exitError{code: exitChanges}
	}

	return nil
}

// fencesStatus: with --exit-code, 2 when a fence is held.
func fencesStatus(rep fence.Report, exitOnFences bool) error {
	if exitOnFences && len(rep.Fences) > 0 {
		return exitError{code: exitChanges}
	}

	return nil
}

// releaseStatus: 5 while a fence is still held.
func releaseStatus(res *fence.RecoveryResult) error {
	if res.Held() > 0 {
		return exitError{code: exitPartial}
	}

	return nil
}

// validateStatus: 1 when the configuration is not valid (as terraform validate).
func validateStatus(v config.Validation) error {
	if !v.Valid {
		return exitError{code: exitFailure}
	}

	return nil
}

// fmtStatus: with --check, 2 when a file is not formatted (it would change).
func fmtStatus(changed []string, check bool) error {
	if check && len(changed) > 0 {
		return exitError{code: exitChanges}
	}

	return nil
}

// applyStatus is apply's exit status from its result: 0 only when the old credential is no
// longer used anywhere (safe to revoke); 6 when the run stopped on its time budget or window, or
// deferred to another tool, with nothing failed (the next run continues); else 5.
func applyStatus(res *apply.Result) error {
	switch {
	case res.ReleaseErr == nil && res.Progressed():
		return exitError{code: exitProgressed}
	case res.Failed() > 0 || res.ReleaseErr != nil || !res.SafeToRevoke():
		return exitError{code: exitPartial}
	}

	return nil
}

// exitError carries an exit code other than 1.
type exitError struct{ code int }

func (e exitError) Error() string { return "exit " + strconv.Itoa(e.code) }

// exitCode maps a command's error to the table above.
func exitCode(err error) int {
	var (
		ee exitError
		le *lease.Error
		ni *credential.NotIsolatedError
	)

	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case apply.IsRefused(err), errors.As(err, &ni):
		return exitRefusedPlan
	case errors.As(err, &le) && le.Class == lease.HeldByAnother:
		return exitLeaseHeld
	}

	return exitFailure
}
