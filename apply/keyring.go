package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/probe"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// The kubelet-keyring path (plan.ActionKeyring): after the Talos config is written live (on
// Talos ≤ 1.13 accepted, not loaded by the runtime until its next boot), ghcrsync's writer pod
// merges the credential into the kubelet's node keyring, and the runtime is proved — with
// evidence that the pull used the keyring, not containerd's own, older credential.

// writeKeyring writes the new credential into the node's kubelet keyring.
func (t *txn) writeKeyring(ctx context.Context) *NodeResult {
	return t.keyring(ctx, keyring.ModeWrite, t.p.AuthDigest)
}

// clearKeyring takes the registry's entry out of a fenced node's kubelet keyring (one an earlier
// rotation wrote, holding another credential), before the reboot that loads the new one.
func (t *txn) clearKeyring(ctx context.Context) *NodeResult {
	if r := t.keyring(ctx, keyring.ModeRemove, ""); r != nil {
		return r
	}

	return t.mirror(ctx, state.PhaseKeyring)
}

// keyring runs the writer in mode on the node (judged and recorded first), checks its report
// holds want, and records on the node what its keyring holds.
func (t *txn) keyring(ctx context.Context, mode keyring.Mode, want string) *NodeResult {
	n, r := t.advance(ctx, plan.StepKeyring, state.PhaseKeyring)
	if r != nil {
		return r
	}

	if t.e.keyrings == nil {
		return t.failKeepingFence("its kubelet keyring cannot be written: nodes.kubelet_keyring is not configured (the writer's image and namespace)")
	}

	rep, err := t.e.keyrings.Run(ctx, t.np.Name, mode, t.rootDir(), t.e.o.ReadyTimeout)
	if err != nil {
		return t.callFailed(ctx, "its kubelet keyring was not written", err)
	}

	if rep.After != want {
		return t.failKeepingFence(fmt.Sprintf("its kubelet keyring %s holds %s after the writer's %s, not %s", rep.Path, human.ShortOrNone(rep.After), mode, human.ShortOrNone(want)))
	}

	// A keyring is read, not trusted: what it held that ghcrsync did not put there is said.
	known := n.Annotations[object.KeyringAnnotation]
	if foreign := slices.DeleteFunc(slices.Clone(rep.Before), func(d string) bool { return d == known || d == want }); len(foreign) > 0 {
		msg := fmt.Sprintf("its kubelet keyring %s held %d credential(s) for %s that ghcrsync did not write there (%s): replaced", rep.Path, len(foreign), t.e.o.Registry,
			strings.Join(shortAll(foreign), ", "))
		t.log.Warn(msg)
		t.event("GhcrsyncKeyringForeign", msg, true)
	}

	t.log.Info("kubelet keyring "+string(mode), "path", rep.Path, "holds", human.ShortOrNone(rep.After), "kept", rep.Kept, "changed", rep.Changed)

	return t.patch(ctx, plan.StepAnnotate, "record its kubelet keyring", func(*corev1.Node) map[string]any { return object.WithKeyring(map[string]any{}, want) }, nil)
}

func shortAll(digests []string) []string {
	out := make([]string, len(digests))
	for i, d := range digests {
		out[i] = human.ShortOrNone(d)
	}

	return out
}

// rootDir is the node's kubelet root directory, as the plan read it from its Talos config.
func (t *txn) rootDir() string {
	if t.np.KubeletRootDir != "" {
		return t.np.KubeletRootDir
	}

	return keyring.DefaultRootDir
}

// proveKeyring proves the runtime pulls with the keyring's credential.
func (t *txn) proveKeyring(ctx context.Context) *NodeResult {
	return t.proveWith(ctx, t.keyringProof)
}

// keyringProof is the proof of a kubelet-keyring node: a probe pull (no pull secret) that can
// only have used the keyring's credential. Either containerd's own credential is refused by the
// registry (an emergency: nothing else can pull), and a passing probe is enough; or the kubelet
// is seen reading its keyring after the write — a probe pull makes it read the file once its
// cache (keyring.CacheLifetime) has expired, and a writer pod awaits the file's access time
// passing its change time, keyring.AwaitStep at a time — and a probe after that read passes: the
// kubelet then holds the keyring's credential for every pull of the next five minutes.
func (t *txn) keyringProof(ctx context.Context) (*NodeResult, error) {
	window := t.e.o.KeyringWindow
	if window <= 0 {
		window = keyring.CacheLifetime + 30*time.Second
	}

	if t.containerdRefused() {
		return t.probeUntil(ctx, window, "only the kubelet keyring's credential can pull: containerd's own is refused by the registry")
	}

	rep, r, err := t.awaitKeyringRead(ctx, window)
	if r != nil || err != nil {
		return r, err
	}

	if !slices.Equal(rep.Before, []string{t.p.AuthDigest}) {
		return nil, fmt.Errorf("its kubelet keyring %s no longer holds only the new credential %s (it holds %s): something else rewrote it after ghcrsync",
			rep.Path, human.Short(t.p.AuthDigest), strings.Join(shortAll(rep.Before), ", "))
	}

	if _, r := t.guard(ctx, plan.StepProve); r != nil {
		return r, nil
	}

	if err := t.e.proveRuntime(ctx, t.np.Name); err != nil {
		return nil, err
	}

	t.keyringProved = fmt.Sprintf("its kubelet read its keyring at %s, %s after the write, and the probe pulled after that",
		human.Clock(rep.ReadAt), rep.ReadAt.Sub(rep.Written).Round(time.Second))

	return nil, nil
}

// awaitKeyringRead makes pulls on the node (probes: they may pass with containerd's credential,
// or fail, neither proves anything yet) until its kubelet has read its keyring, within window.
func (t *txn) awaitKeyringRead(ctx context.Context, window time.Duration) (keyring.Report, *NodeResult, error) {
	deadline := t.e.clock.Now().Add(window)

	for first := true; ; first = false {
		// Every pod made on the node is judged first (advance judged the first).
		if !first {
			if _, r := t.guard(ctx, plan.StepProve); r != nil {
				return keyring.Report{}, r, nil
			}
		}

		if err := t.e.workloads.ProveRuntime(ctx, t.np.Name, t.e.o.Probe, t.e.o.ReadyTimeout); err != nil && !errors.As(err, new(*probe.PullError)) {
			t.log.Debug("a probe while waiting for the kubelet to read its keyring did not run", "error", t.answer(err))
		}

		if _, r := t.guard(ctx, plan.StepProve); r != nil {
			return keyring.Report{}, r, nil
		}

		rep, err := t.e.keyrings.Run(ctx, t.np.Name, keyring.ModeAwait, t.rootDir(), keyring.AwaitStep+t.e.o.ReadyTimeout)
		if err != nil {
			return rep, nil, fmt.Errorf("its kubelet keyring's read could not be awaited: %w", err)
		}

		if !rep.ReadAt.IsZero() {
			return rep, nil, nil
		}

		if t.e.clock.Now().After(deadline) {
			return rep, nil, fmt.Errorf("its kubelet did not read its keyring %s within %s of the write (at %s): its kubelet may keep its root directory elsewhere than %s "+
				"(machine.kubelet.extraArgs root-dir), or its file system may not record reads (noatime); the next plan reboots it instead",
				rep.Path, window, human.Clock(rep.Written), t.rootDir())
		}

		t.log.Info("waiting for the kubelet to read its keyring (it reads it again at a pull, at most " + keyring.CacheLifetime.String() + " after its last read)")
	}
}

// probeUntil probes until one passes, within window: a refused pull is tried again every
// keyring.AwaitStep (the kubelet may still hold its cache of the keyring from before the write),
// each pod judged first.
func (t *txn) probeUntil(ctx context.Context, window time.Duration, why string) (*NodeResult, error) {
	deadline := t.e.clock.Now().Add(window)

	for first := true; ; first = false {
		if !first {
			if _, r := t.guard(ctx, plan.StepProve); r != nil {
				return r, nil
			}
		}

		err := t.e.proveRuntime(ctx, t.np.Name)
		if err == nil {
			t.keyringProved = why

			return nil, nil
		}

		if !errors.As(err, new(*probe.PullError)) || t.e.clock.Now().After(deadline) {
			return nil, fmt.Errorf("no probe passed within %s of the keyring write: %w", window, err)
		}

		if err := clock.Sleep(ctx, t.e.clock, keyring.AwaitStep); err != nil {
			return nil, err
		}
	}
}

// containerdRefused reports whether the credential the node's containerd holds is one the
// registry refused when the plan was made: its config held it, and its runtime is not stale.
func (t *txn) containerdRefused() bool {
	if slices.Contains(t.p.StaleRuntimes, t.np.Name) {
		return false
	}

	for _, u := range t.p.Refused() {
		if slices.Contains(u.Nodes, t.np.Name) {
			return true
		}
	}

	return false
}
