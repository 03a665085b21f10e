package talos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/registryauth"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Configure writes the credential into the node's machine config. When live, the change is
// applied without a reboot (Talos 1.14+); otherwise it is staged for the next boot: an older
// Talos accepts a no-reboot registry-auth change, but its container runtime keeps the credential
// it booted with (applied, not loaded), so only the reboot that follows makes it count. The new
// config is built on the next-boot config (so a change an operator staged is kept, never
// dropped) — the one its guard's ConfigFacts just read at the address, else read again.
//
// It returns a time on the machine's clock that the runtime must have started after to run on
// the written config. A staged write, or one whose answer was lost, is read back and checked,
// and that is when the write changed the config. A live write that answered is not read back:
// the runtime's start is asked right before it (one one-to-many call for the nodes writing at
// once), it returns the later of that start and the config's last change before the write, and
// the proof's own read of the active config afterwards is the read-back — it checks the
// credential, and that the runtime it saw start did so after the config it found (apply's
// proveWith). Without that start (its call failed) the write is read back.
func (c *Client) Configure(ctx context.Context, node, registry, username, password string, live bool) (time.Time, error) {
	c.writing(node)

	var before time.Time // the runtime's start right before a live write (asked with the wave's)
	if live {
		before, _ = c.RuntimeStarted(ctx, node) // before the write's own deadline starts
	}

	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	guard := c.recalled(node)

	next, err := c.base(nctx, Read{next: guard.next})
	if err != nil {
		return time.Time{}, fmt.Errorf("read machine config of %s: %w", node, err)
	}

	data, err := registryauth.With(next, registry, username, password)
	if err != nil {
		return time.Time{}, fmt.Errorf("build machine config for %s: %w", node, err)
	}

	mode, check := machine.ApplyConfigurationRequest_STAGED, talosconfig.PersistentID
	if live {
		mode, check = machine.ApplyConfigurationRequest_NO_REBOOT, talosconfig.ActiveID
	}

	_, err = c.c.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: data, Mode: mode})

	switch {
	case err != nil && !Ambiguous(err):
		return time.Time{}, fmt.Errorf("apply machine config to %s (%s): %w", node, mode, err)
	case err != nil:
		// The answer was lost, perhaps not the write: the read-back below tells (its own
		// deadline: the call's may be what expired).
		cancel()

		nctx, cancel = c.bounded(ctx, node)
		defer cancel()
	case live && guard.next != nil && !before.IsZero() && registryauth.Digest(next, registry) != authdigest.Of(username, password):
		// a change (a config that carried the credential already is read back: no restart
		// would follow it)
		return later(before, guard.updated), nil
	}

	got, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, c.c.COSI, check)
	if err != nil {
		return time.Time{}, fmt.Errorf("read back machine config of %s: %w", node, err)
	}

	if digest(got, registry) != authdigest.Of(username, password) {
		return time.Time{}, fmt.Errorf("machine config of %s does not carry the new credential after %s apply", node, mode)
	}

	return got.Metadata().Updated().UTC(), nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}

	return a
}

// DryRun asks the node's Talos what it would do with exactly the config Configure would write
// (ApplyConfiguration with dry_run: the mode it would take, never a write), built on the
// next-boot config FillFacts read (read again when it kept none). refused is Talos's own refusal
// of the config; err is a call that did not get an answer (nothing is known).
func (c *Client) DryRun(ctx context.Context, node string, read Read, registry, username, password string, live bool) (mode, refused string, err error) {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	next, err := c.base(nctx, read)
	if err != nil {
		return "", "", fmt.Errorf("read machine config of %s: %w", node, err)
	}

	data, err := registryauth.With(next, registry, username, password)
	if err != nil {
		return "", "", fmt.Errorf("build machine config for %s: %w", node, err)
	}

	m := machine.ApplyConfigurationRequest_STAGED
	if live {
		m = machine.ApplyConfigurationRequest_NO_REBOOT
	}

	resp, err := c.c.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: data, Mode: m, DryRun: true})
	if err != nil {
		// Only Talos judging the config is a refusal; anything else (no answer, a role that may
		// not apply, an older Talos without dry runs) leaves the question open.
		if c := status.Code(err); c != codes.InvalidArgument && c != codes.FailedPrecondition {
			return "", "", fmt.Errorf("dry run on %s: %w", node, err)
		}

		return "", redact.Error(err), nil
	}

	if msgs := resp.GetMessages(); len(msgs) > 0 {
		return dryRunSummary(msgs[0].GetMode().String(), msgs[0].GetModeDetails()), "", nil
	}

	return m.String(), "", nil
}

// base is the next-boot config a change is built on: the one FillFacts read, or a fresh read.
func (c *Client) base(nctx context.Context, read Read) (config.Provider, error) {
	if read.next != nil {
		if p, err := configloader.NewFromBytes(read.next); err == nil {
			return p, nil
		}
	}

	_, next, err := c.configs(nctx)
	if err != nil {
		return nil, err
	}

	return next.Provider(), nil
}

// dryRunSummary is machined's dry-run answer in one line: the mode, and what it would have done
// ("Dry run summary:\n<what> (skipped in dry-run).\nConfig diff: ...").
func dryRunSummary(mode, details string) string {
	for _, line := range strings.Split(details, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line == "Dry run summary:" {
			continue
		}

		return mode + ": " + strings.TrimSuffix(strings.TrimSuffix(line, "."), " (skipped in dry-run)")
	}

	return mode
}

// Reboot asks the node to reboot.
func (c *Client) Reboot(ctx context.Context, node string) error {
	c.forget(node)

	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	if err := c.c.Reboot(nctx); err != nil {
		if Ambiguous(err) {
			return fmt.Errorf("reboot %s: %w (%w)", node, ErrAnswerLost, err)
		}

		return fmt.Errorf("reboot %s: %w", node, err)
	}

	return nil
}

// ErrAnswerLost marks a call whose answer never came: it may have been carried out.
var ErrAnswerLost = errors.New("the answer was lost")

// Ambiguous reports whether a Talos call's error leaves open whether the machine acted on it: no
// answer came (the connection dropped, the machine went down answering, the deadline passed).
func Ambiguous(err error) bool {
	if err == nil {
		return false
	}

	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return true
	}

	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Etcd reads node's etcd member (plan.EtcdView): its status, the member list and the alarm
// list. Every read must answer: an unreadable status is no evidence of health.
func (c *Client) Etcd(ctx context.Context, node string) (*plan.EtcdView, error) {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	st, err := c.c.EtcdStatus(nctx)
	if err != nil {
		return nil, fmt.Errorf("etcd status of %s: %w", node, err)
	}

	out := &plan.EtcdView{}

	for _, m := range st.GetMessages() {
		ms := m.GetMemberStatus()
		out.Errors = append(out.Errors, ms.GetErrors()...)
		out.Learner = ms.GetIsLearner()
	}

	members, err := c.c.EtcdMemberList(nctx, &machine.EtcdMemberListRequest{})
	if err != nil {
		return nil, fmt.Errorf("etcd members from %s: %w", node, err)
	}

	names := map[uint64]string{}

	for _, m := range members.GetMessages() {
		for _, mem := range m.GetMembers() {
			out.Members = append(out.Members, plan.EtcdMember{Hostname: mem.GetHostname(), Learner: mem.GetIsLearner()})
			names[mem.GetId()] = mem.GetHostname()
		}
	}

	alarms, err := c.c.EtcdAlarmList(nctx)
	if err != nil {
		return nil, fmt.Errorf("etcd alarms from %s: %w", node, err)
	}

	for _, m := range alarms.GetMessages() {
		for _, a := range m.GetMemberAlarms() {
			if a.GetAlarm() != machine.EtcdMemberAlarm_NONE {
				out.Alarms = append(out.Alarms, a.GetAlarm().String()+" on "+orID(names[a.GetMemberId()], a.GetMemberId()))
			}
		}
	}

	return out, nil
}

func orID(name string, id uint64) string {
	if name != "" {
		return name
	}

	return fmt.Sprintf("member %x", id)
}

// Nodename is the Kubernetes node name the machine at node says it is (Talos's own Nodename
// resource): that the machine at an address is the Node it is taken for is checked by it.
func (c *Client) Nodename(ctx context.Context, node string) (string, error) {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	n, err := safe.StateGetByID[*k8s.Nodename](nctx, c.c.COSI, k8s.NodenameID)
	if err != nil {
		return "", fmt.Errorf("read the node name of the machine at %s: %w", node, err)
	}

	return n.TypedSpec().Nodename, nil
}
