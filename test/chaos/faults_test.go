package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/registryauth"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// A fault is one kind of trouble the campaign injects during an apply. inject blocks for the
// fault's duration (honouring ctx: the apply ended) and returns what it did, in a few words;
// anything that must be undone before recovery is registered with r.onHeal.
type fault struct {
	name   string
	inject func(ctx context.Context, r *seedRun) string
}

// The operator's marks, which ghcrsync must never undo.
const (
	operatorTaint = "chaos.example.com/maintenance"
	operatorLabel = "chaos.example.com/operator-change"
	blockingPDB   = "chaos-block"
)

// catalog is every fault the campaign draws from (besides the kubelet heartbeats and the
// autoscaler's candidate churn, which run all the time, and the signals sent to apply).
var catalog = []fault{
	{"scale-down", func(ctx context.Context, r *seedRun) string {
		name := r.pick(autoscaledOnly)
		if name == "" {
			return "no autoscaled node"
		}

		if _, err := r.sb.Do(ctx, "scale-down", sandbox.Request{Node: name}); err != nil {
			return name + " kept (" + firstLine(err.Error()) + ")"
		}

		return name
	}},
	{"scale-up", func(ctx context.Context, r *seedRun) string {
		out, err := r.sb.Do(ctx, "scale-up", sandbox.Request{})
		if err != nil {
			return "failed: " + firstLine(err.Error())
		}

		return out.(map[string]string)["added"]
	}},
	{"delete-node", func(ctx context.Context, r *seedRun) string {
		name := r.pick(autoscaledOnly)
		if name == "" {
			return "no autoscaled node"
		}

		if _, err := r.sb.Do(ctx, "delete-node", sandbox.Request{Node: name}); err != nil {
			return name + " failed: " + firstLine(err.Error())
		}

		return name
	}},
	{"endpoint-reboot", func(ctx context.Context, r *seedRun) string {
		name := r.endpointNode()
		_, _ = r.sb.Do(ctx, "reboot", sandbox.Request{Node: name})

		return name
	}},
	{"endpoint-power-cycle", func(ctx context.Context, r *seedRun) string {
		name := r.endpointNode()
		m, ok := r.sb.Fleet().Machine(name)
		if !ok {
			return "no endpoint node"
		}

		off := r.duration(time.Second, 4*time.Second)
		r.onHeal(m.PowerOn)
		m.PowerOff()
		sleep(ctx, off)
		m.PowerOn()

		return fmt.Sprintf("%s off %s", name, off)
	}},
	{"api-outage", func(ctx context.Context, r *seedRun) string {
		d := r.leaseDuration + 2*time.Second
		until := time.Now().Add(d)

		if _, err := r.sb.Do(ctx, "api-outage", sandbox.Request{Duration: d.String()}); err != nil {
			return "failed: " + err.Error()
		}

		r.onHeal(func() { time.Sleep(time.Until(until) + 200*time.Millisecond) })

		return d.String()
	}},
	{"second-apply", func(ctx context.Context, r *seedRun) string {
		p, err := r.c.cli.start("apply", "--auto-approve", "--config", r.cfg)
		if err != nil {
			return "failed to start: " + err.Error()
		}

		r.addApply(p, true)

		if err := p.wait(4 * time.Minute); err != nil {
			r.problem("second apply: %v", err)
		}

		code, _ := p.exit()

		return fmt.Sprintf("exit %d", code)
	}},
	{"operator-cordon", func(ctx context.Context, r *seedRun) string {
		name := r.pick(anyNode)
		done := false

		err := r.updateNode(ctx, name, func(n *corev1.Node) bool {
			if n.Spec.Unschedulable {
				return false // `kubectl cordon` of a cordoned node changes nothing
			}

			n.Spec.Unschedulable, done = true, true

			return true
		})
		if err != nil || !done {
			return name + " already cordoned"
		}

		r.markCordoned(name)

		return name
	}},
	{"operator-taint", func(ctx context.Context, r *seedRun) string {
		name := r.pick(anyNode)

		err := r.updateNode(ctx, name, func(n *corev1.Node) bool {
			for _, t := range n.Spec.Taints {
				if t.Key == operatorTaint {
					return false
				}
			}

			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: operatorTaint, Value: "chaos", Effect: corev1.TaintEffectNoSchedule})

			return true
		})
		if err != nil {
			return name + " failed: " + firstLine(err.Error())
		}

		r.markTainted(name)

		return name
	}},
	{"operator-stage", func(ctx context.Context, r *seedRun) string {
		name := r.pick(anyNode)
		if err := r.stageOperatorChange(ctx, name, nil); err != nil {
			return name + " failed: " + firstLine(err.Error())
		}

		return name
	}},
	{"talos-hang", func(ctx context.Context, r *seedRun) string {
		name := r.pick(anyNode)
		m, ok := r.sb.Fleet().Machine(name)
		if !ok {
			return name + " gone"
		}

		d := r.duration(2*time.Second, 8*time.Second)
		r.onHeal(func() { m.SetHung(false) })
		m.SetHung(true)
		sleep(ctx, d)
		m.SetHung(false)

		return fmt.Sprintf("%s %s", name, d)
	}},
	{"talos-slow", func(ctx context.Context, r *seedRun) string {
		name := r.pick(anyNode)
		m, ok := r.sb.Fleet().Machine(name)
		if !ok {
			return name + " gone"
		}

		lat, d := r.duration(500*time.Millisecond, 2*time.Second), r.duration(3*time.Second, 10*time.Second)
		r.onHeal(func() { m.SetLatency(0) })
		m.SetLatency(lat)
		sleep(ctx, d)
		m.SetLatency(0)

		return fmt.Sprintf("%s +%s for %s", name, lat, d)
	}},
	{"pdb-block", func(ctx context.Context, r *seedRun) string {
		d := r.duration(2*time.Second, 10*time.Second)
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: blockingPDB, Namespace: "apps"},
			Spec: policyv1.PodDisruptionBudgetSpec{
				MaxUnavailable: ptr.To(intstr.FromInt32(0)),
				Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			},
		}

		if _, err := r.kube.PolicyV1().PodDisruptionBudgets("apps").Create(ctx, pdb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return "failed: " + firstLine(err.Error())
		}

		r.onHeal(r.deleteBlockingPDB)
		sleep(ctx, d)
		r.deleteBlockingPDB()

		return d.String()
	}},
	{"revoke-old-credential", func(ctx context.Context, r *seedRun) string {
		r.sb.Registry().RevokeCredential(r.old.Username)

		return r.old.Username
	}},
	{"lost-answers", func(ctx context.Context, r *seedRun) string {
		// The API endpoint cuts every answer on its way back for a while: the server did the
		// work, ghcrsync never hears.
		d := r.duration(500*time.Millisecond, 3*time.Second)
		if _, err := r.sb.Do(ctx, "lose-answers", sandbox.Request{Duration: d.String()}); err != nil {
			return "failed: " + err.Error()
		}

		r.onHeal(func() { time.Sleep(d) })

		return d.String()
	}},
	{"lost-talos-answer", func(ctx context.Context, r *seedRun) string {
		name := r.pick(anyNode)
		m, ok := r.sb.Fleet().Machine(name)
		if !ok {
			return name + " gone"
		}

		r.onHeal(func() { m.LoseAnswers(0) })
		m.LoseAnswers(1)

		return name
	}},
	{"etcd-alarm", func(ctx context.Context, r *seedRun) string {
		name := r.pick(controlPlanesOnly)
		m, ok := r.sb.Fleet().Machine(name)
		if !ok {
			return "no control plane"
		}

		alarm := []string{"NOSPACE", "CORRUPT"}[r.intn(2)]
		d := r.duration(time.Second, 6*time.Second)
		r.onHeal(func() { m.SetEtcd(false, "") })
		m.SetEtcd(false, alarm)
		sleep(ctx, d)
		m.SetEtcd(false, "")

		return fmt.Sprintf("%s %s %s", name, alarm, d)
	}},
	{"address-move", func(ctx context.Context, r *seedRun) string {
		name, to := r.pick(anyNode), r.pick(anyNode)
		m, ok := r.sb.Fleet().Machine(name)
		target, ok2 := r.sb.Fleet().Machine(to)

		if !ok || !ok2 || name == to {
			return "no pair"
		}

		d := r.duration(time.Second, 6*time.Second)
		r.onHeal(func() { m.ReportIP("") })
		m.ReportIP(target.IP)
		sleep(ctx, d)
		m.ReportIP("")

		return fmt.Sprintf("%s → %s %s", name, to, d)
	}},
}

func (r *seedRun) deleteBlockingPDB() {
	err := r.kube.PolicyV1().PodDisruptionBudgets("apps").Delete(context.Background(), blockingPDB, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		r.problem("delete PDB %s: %v", blockingPDB, err)
	}
}

// updateNode is an operator's read-modify-write of a Node (kubectl does the same).
func (r *seedRun) updateNode(ctx context.Context, name string, mutate func(*corev1.Node) bool) error {
	return sandboxtest.EditNode(ctx, r.kube, name, func(n *corev1.Node) { mutate(n) }) // unchanged: a no-op update
}

// stageOperatorChange stages a label change for the node's next boot, as a person would, with
// the operator's own Talos identity; with cred, the change also carries that credential (the
// operator re-stages their change together with the new credential).
func (r *seedRun) stageOperatorChange(ctx context.Context, name string, cred *sandbox.Credential) error {
	m, ok := r.sb.Fleet().Machine(name)
	if !ok {
		return fmt.Errorf("no machine %s", name)
	}

	tc, err := client.New(ctx, client.WithConfigFromFile(r.sb.Path(sandbox.TalosconfigOperatorFile)))
	if err != nil {
		return err
	}
	defer tc.Close()

	nctx := client.WithNode(ctx, m.IP)

	cur, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, tc.COSI, talosconfig.PersistentID)
	if err != nil {
		return err
	}

	patch, err := configpatcher.LoadPatch([]byte("machine:\n  nodeLabels:\n    " + operatorLabel + ": \"yes\"\n"))
	if err != nil {
		return err
	}

	out, err := configpatcher.Apply(configpatcher.WithConfig(cur.Provider()), []configpatcher.Patch{patch})
	if err != nil {
		return err
	}

	data, err := out.Bytes()
	if err != nil {
		return err
	}

	if cred != nil {
		provider, err := configloader.NewFromBytes(data)
		if err != nil {
			return err
		}

		if data, err = registryauth.With(provider, registry.RegistryHost, cred.Username, cred.Password); err != nil {
			return err
		}
	}

	// Marked before the call: an answer the sandbox loses (lost-talos-answer) may hide a write
	// that landed, and the operator resolves the change either way (discarding an unstaged one
	// changes nothing), so the next seed never inherits it.
	r.markStaged(name)

	if _, err := tc.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_STAGED}); err != nil {
		return err
	}

	return nil
}

// discardStagedChange stages the active config again: nothing differs for the next boot.
func (r *seedRun) discardStagedChange(ctx context.Context, name string) error {
	m, ok := r.sb.Fleet().Machine(name)
	if !ok {
		return nil
	}

	tc, err := client.New(ctx, client.WithConfigFromFile(r.sb.Path(sandbox.TalosconfigOperatorFile)))
	if err != nil {
		return err
	}
	defer tc.Close()

	nctx := client.WithNode(ctx, m.IP)

	active, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, tc.COSI, talosconfig.ActiveID)
	if err != nil {
		return err
	}

	data, err := active.Provider().Bytes()
	if err != nil {
		return err
	}

	_, err = tc.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_STAGED})

	return err
}

// configLabel reads the operator's label from the node's active or persistent (staged) Talos config.
func (r *seedRun) configLabel(ctx context.Context, name string, id resource.ID) (string, error) {
	m, ok := r.sb.Fleet().Machine(name)
	if !ok {
		return "", nil
	}

	tc, err := client.New(ctx, client.WithConfigFromFile(r.sb.Path(sandbox.TalosconfigOperatorFile)))
	if err != nil {
		return "", err
	}
	defer tc.Close()

	mc, err := safe.StateGetByID[*talosconfig.MachineConfig](client.WithNode(ctx, m.IP), tc.COSI, id)
	if err != nil {
		return "", err
	}

	return mc.Config().Machine().NodeLabels()[operatorLabel], nil
}

// Node filters for pick.
func anyNode(sandbox.MachineInfo) bool          { return true }
func autoscaledOnly(m sandbox.MachineInfo) bool { return m.Autoscaled }

func controlPlanesOnly(m sandbox.MachineInfo) bool { return m.Role == string(sandbox.RoleControlPlane) }

// pick draws one machine name (sorted order, seeded draw), "" if none matches.
func (r *seedRun) pick(match func(sandbox.MachineInfo) bool) string {
	var names []string

	for _, m := range r.sb.FleetInfo() {
		if match(m) {
			names = append(names, m.Name)
		}
	}

	if len(names) == 0 {
		return ""
	}

	slices.Sort(names)

	r.mu.Lock()
	defer r.mu.Unlock()

	return names[r.rng.IntN(len(names))]
}

func (r *seedRun) endpointNode() string {
	for _, m := range r.sb.FleetInfo() {
		if m.Endpoint {
			return m.Name
		}
	}

	return ""
}

// duration draws a duration in [lo, hi), in 100 ms steps.
func (r *seedRun) duration(lo, hi time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()

	steps := int((hi - lo) / (100 * time.Millisecond))

	return lo + time.Duration(r.rng.IntN(steps))*100*time.Millisecond
}

// intn draws an int in [0, n).
func (r *seedRun) intn(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()

	return r.rng.IntN(n)
}
