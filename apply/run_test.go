package apply

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	goldenfile "github.com/ghcrsync/ghcrsync/internal/golden"
	"github.com/ghcrsync/ghcrsync/internal/lease"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// runScript is one block of testdata/run/*.txt: a whole run (apply.Run) over fakes of its
// ports, on a fake clock — the run's ordering rules in milliseconds, as txn's scripts are one
// node's. The plan is plan.Make's, from the fakes' snapshot, as `ghcrsync plan` makes it.
//
//	case NAME
//	fleet w1 cp1                 nodes (cp… are control planes) on Talos 1.13: fenced, each
//	                             reboot taking 5 minutes of the run's (fake) clock
//	live l1                      nodes on Talos 1.14: updated live
//	endpoint cp1                 the API endpoint's node (rebooted last)
//	consumers apps/a apps/b      consumer pull secrets (holding the old credential)
//	revoked                      the registry refuses the old credential: an emergency
//	within 20m                   apply --within (a fenced node's estimate is 6m)
//	fail prove|preflight|suspend|resume  a port's answer is an error
//	lifted 1                     from the root on, someone lifts the run's Flux suspension at
//	                             each of the next N reads (`flux resume`)
//	drain-fails w1 MESSAGE       (also probe-fails NODE MESSAGE)
//	joins w3 at relist 1         a node joins the fleet as the run re-lists it
//	old x1                       a node the plan leaves alone (nodes.exclude), on the old credential
//	rotated w1 apps/a            nodes and pull secrets already on the new credential
//	at w1 PHASE cancel|lose-lease|delete  before w1's PHASE mutation
//	=>
//	…                             what the run did through its ports, in order (a node's
//	                              judgements and state writes folded away: txn pins those)
//	nodes: w1=done …              each node's outcome; then the secrets, Flux, the Lease, the verdict
type runScript struct {
	goldenfile.Case

	fleet, live, consumers, old []string
	rotated                     []string // nodes and pull secrets already on the new credential
	endpoint                    string
	revoked                     bool
	lifts                       int // someone lifts the run's suspension this many times
	within                      time.Duration
	fails                       map[string]bool
	faults                      []string
	joins                       map[int][]string
	events                      []string
}

func TestRunScripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "run", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no run scripts: %v", err)
	}

	fx := newRunFixture(t)
	cases := 0

	for _, file := range files {
		header, blocks := goldenfile.ReadCases(t, file)

		var rendered [][]string

		for _, b := range blocks {
			s := parseRunScript(t, file, b)
			got := s.run(t, fx)

			if !goldenfile.Updating() && !slices.Equal(got, b.Want) {
				t.Errorf("%s: case %s:\n got:\n%s\nwant:\n%s", s.At(), s.Name, indent(got), indent(b.Want))
			}

			rendered = append(rendered, got)
			cases++
		}

		if goldenfile.Updating() {
			goldenfile.WriteCases(t, file, header, blocks, rendered)
		}
	}

	if cases < 15 {
		t.Errorf("%d run scripts; the run's order rules want at least 15", cases)
	}
}

func indent(lines []string) string { return "  " + strings.Join(lines, "\n  ") }

func parseRunScript(t *testing.T, file string, b goldenfile.Case) runScript {
	t.Helper()

	s := runScript{Case: b, fails: map[string]bool{}, joins: map[int][]string{}}

	for _, line := range b.Input {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}

		switch f[0] {
		case "fleet":
			s.fleet = append(s.fleet, f[1:]...)
		case "live":
			s.live = append(s.live, f[1:]...)
		case "endpoint":
			s.endpoint = f[1]
		case "consumers":
			s.consumers = append(s.consumers, f[1:]...)
		case "rotated":
			s.rotated = append(s.rotated, f[1:]...)
		case "old":
			s.old = append(s.old, f[1:]...)
		case "revoked":
			s.revoked = true
		case "within":
			d, err := time.ParseDuration(f[1])
			if err != nil {
				t.Fatalf("%s: %q: %v", s.At(), line, err)
			}

			s.within = d
		case "fail":
			s.fails[f[1]] = true
		case "lifted":
			if _, err := fmt.Sscanf(f[1], "%d", &s.lifts); err != nil {
				t.Fatalf("%s: %q: %v", s.At(), line, err)
			}
		case "drain-fails", "probe-fails":
			s.faults = append(s.faults, line)
		case "joins":
			var round int
			if _, err := fmt.Sscanf(strings.Join(f[2:], " "), "at relist %d", &round); err != nil {
				t.Fatalf("%s: %q: %v", s.At(), line, err)
			}

			s.joins[round] = append(s.joins[round], f[1])
		case "at":
			s.events = append(s.events, line)
		default:
			t.Fatalf("%s: unknown line %q in %s", s.At(), line, file)
		}
	}

	return s
}

// runFixture is what every script shares: the configuration and the SOPS credential.
type runFixture struct {
	dir  string
	cfg  *config.Config
	cred *credential.Credential
}

func newRunFixture(t *testing.T) runFixture {
	t.Helper()

	dir := t.TempDir()
	identity, recipient, err := secretfile.NewAgeKey()
	if err != nil {
		t.Fatal(err)
	}

	enc, err := secretfile.Encrypt(secretfile.DockerConfigJSON("ghcr.io", "fleet-new", "ghp_run_scripts_new"), recipient)
	if err != nil {
		t.Fatal(err)
	}

	files := map[string]string{
		"age.key": string(identity), "secret.enc.yaml": string(enc), "kubeconfig": "{}", "talosconfig": "{}",
		"ghcrsync.hcl": `
cluster {
  kubeconfig = "kubeconfig"
}
talos {
  talosconfig = "talosconfig"
}
credential "ghcr" {
  registry  = "ghcr.io"
  sops_file = "secret.enc.yaml"
  key       = ["stringData", "ghcr_dockerconfigjson"]
  prove     = ["ghcrsync/private-probe:v1"]
}
nodes {
  ready_timeout = "10m"
  runtime_probe {
    image     = "ghcr.io/ghcrsync/private-probe:v1"
    namespace = "ghcrsync-probe"
  }
}
consumers {
  selector = "ghcrsync.dev/pull-secret=ghcr"
  secret   = "ghcr-pull"
}
flux_root {
  namespace = "flux-system"
  secret    = "ghcr-auth"
}
flux {
  suspend = ["flux-system/apps"]
}
`,
	}

	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	cfg, err := config.Load(filepath.Join(dir, "ghcrsync.hcl"))
	if err != nil {
		t.Fatal(err)
	}

	t.Setenv("SOPS_AGE_KEY_FILE", filepath.Join(dir, "age.key"))

	cred, err := credential.Load(cfg.Credential.SopsFile, cfg.Credential.Key, cfg.Credential.Registry)
	if err != nil {
		t.Fatal(err)
	}

	return runFixture{dir: dir, cfg: cfg, cred: cred}
}

// runWorld is the txn world with the rest of the cluster a run reaches: the pull secrets, the
// Kustomizations, the Lease (a fake clientset's), and a log of every port's call.
type runWorld struct {
	*world
	s     runScript
	fx    runFixture
	clock *clock.Fake
	kube  *fake.Clientset
	lease *lease.Lease // the run's, once acquired

	secrets   map[string]string // "namespace/name" → "old" | "new"
	suspended map[string]bool
	requested map[string]string // a Kustomization's last suspension's reconcile request
	taken     map[string]string // and the last one kustomize-controller answered
	lifts     int               // the lifts still to come ("lifted N")
	relists   int
	mu        sync.Mutex
}

func (s runScript) run(t *testing.T, fx runFixture) []string {
	t.Helper()

	w := &runWorld{world: newWorld(), s: s, fx: fx, clock: clock.NewFake(time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)), kube: fake.NewClientset(),
		secrets: map[string]string{"flux-system/ghcr-auth": "old"}, suspended: map[string]bool{},
		requested: map[string]string{}, taken: map[string]string{}}

	for _, n := range slices.Concat(s.fleet, s.live, s.old) {
		w.addNode(n, strings.HasPrefix(n, "cp"))
	}

	for _, c := range s.consumers {
		w.secrets[c] = "old"
	}

	w.onReboot = func() { w.clock.Advance(5 * time.Minute) }

	for _, x := range s.rotated {
		if strings.Contains(x, "/") {
			w.secrets[x] = "new"

			continue
		}

		w.active[x], w.staged[x] = "new", "new"
		w.configUpdated[x], w.criStarted[x] = w.tick(), w.tick()
	}

	for _, line := range s.faults {
		f := strings.Fields(line)
		err := errors.New(strings.Join(f[2:], " "))

		if f[0] == "drain-fails" {
			w.drainErr[f[1]] = err
		} else {
			w.probeErr[f[1]] = err
		}
	}

	st := &state.State{}
	store := &state.Local{Path: filepath.Join(t.TempDir(), "state.json")}

	snap, in, err := w.ReadJudged(context.Background(), false) // as plan reads: the registry judges the credentials in use
	if err != nil {
		t.Fatal(err)
	}

	in.State = plan.StateRef{Lineage: st.Lineage, Serial: st.Serial}
	p := plan.Make(snap, in)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	inputs := Inputs{
		Inputs: fence.Inputs{
			Config: fx.cfg, Nodes: fakeNodes{w.world}, Leases: runLeases{w}, Flux: runFlux{w}, Events: runEvents{},
			Store: store, State: st, Clock: w.clock,
		},
		Fleet: w, Registry: runRegistry{w}, Admission: runAdmission{w}, NodeAPI: fakeNodes{w.world}, Workloads: fakeNodes{w.world},
		Watches: runWatches{}, Suspensions: runFlux{w}, PullSecrets: runSecrets{w}, Leasing: runLeasing{w}, Server: "https://10.0.0.1:6443",
		Credential: fx.cred,
	}

	hooks := Hooks{
		BeforeMutation: func(node string, phase state.Phase) {
			for _, ev := range s.events {
				if f := strings.Fields(ev); f[1] == node && f[2] == string(phase) {
					w.event(node, f[3], cancel)
				}
			}
		},
		BeforeRoot: func() { // "lifted N": someone lifts the suspension from here on
			w.world.mu.Lock()
			defer w.world.mu.Unlock()

			w.lifts = s.lifts
		},
		BeforeRelist: func(round int) {
			for _, n := range s.joins[round] {
				if _, err := (fakeNodes{w.world}).Get(context.Background(), n); err != nil { // the first round 1 only
					w.record("joins %s", n)
					w.addNode(n, false)
				}
			}
		},
	}

	res, err := Run(ctx, inputs, p, Options{Within: s.within, Hooks: hooks})

	return w.render(res, err)
}

// event is what an "at" line lands before a mutation.
func (w *runWorld) event(node, what string, cancel context.CancelFunc) {
	switch what {
	case "delete":
		w.record("-- the cluster deletes %s", node)
		w.world.mu.Lock()
		delete(w.nodes, node)
		w.world.mu.Unlock()
	case "cancel":
		w.record("-- cancelled")
		cancel()
	case "lose-lease":
		w.record("-- the Lease is taken by another run")

		// Taken as another run takes it: a compare-and-swap, tried again when the heartbeat's
		// renewal lands in between (a conflict).
		leases := w.kube.CoordinationV1().Leases("flux-system")
		for range 100 {
			l, err := leases.Get(context.Background(), "ghcr-auth-refresh", metav1.GetOptions{})
			if err != nil {
				break
			}

			other := "another-run"
			l.Spec.HolderIdentity = &other

			if _, err := leases.Update(context.Background(), l, metav1.UpdateOptions{}); err == nil {
				break
			}
		}

		// As the heartbeat's next renewal finds it (its interval is a few milliseconds here):
		// the mutation this event stands before is the first to meet the loss.
		select {
		case <-w.lease.Done():
		case <-time.After(5 * time.Second):
			w.record("-- the run did not notice within 5 s")
		}
	}
}

// render is the transcript: the world's log without a node's judgements, state writes and
// phase mirrors (txn's scripts pin those), then what the run left.
func (w *runWorld) render(res *Result, err error) []string {
	w.world.mu.Lock()
	defer w.world.mu.Unlock()

	var out []string

	for _, l := range w.log {
		if strings.HasPrefix(l, "judge ") || strings.HasPrefix(l, "state ") || strings.Contains(l, " phase=") {
			continue
		}

		switch f := strings.Fields(l); {
		case strings.Contains(l, `"ghcrsync.dev/steered-by":"`):
			hard := strings.Contains(l, `"effect":"NoSchedule"`) // an emergency's, or --allow-pending's

			l = "steer " + f[1]
			if hard {
				l += " (hard)"
			}
		case strings.Contains(l, `"ghcrsync.dev/steered-by":null`):
			l = "unsteer " + f[1]
		}

		out = append(out, l)
	}

	out = sortRuns(out, "steer ", "unsteer ")

	if err != nil {
		return append(out, "error: "+err.Error())
	}

	var nodes []string
	for _, r := range res.Nodes {
		x := r.Node + "=" + string(r.Outcome)
		switch {
		case r.Outcome == state.OutcomeDone:
		case strings.Contains(r.Message, "lease lost"): // met by whichever step of the node comes first
			x += " (lease lost)"
		default:
			x += " (" + firstWords(r.Message, 8) + ")"
		}

		nodes = append(nodes, x)
	}

	out = append(out, "nodes: "+orNone(strings.Join(nodes, " ")))

	var secrets []string
	for _, s := range res.Secrets {
		secrets = append(secrets, s.Namespace+"/"+s.Secret+"="+string(s.Outcome))
	}

	out = append(out, "secrets: "+orNone(strings.Join(secrets, " ")))

	suspended := []string{}
	for _, k := range sortedKeys(w.suspended) {
		if w.suspended[k] {
			suspended = append(suspended, k)
		}
	}

	out = append(out, "flux suspended: "+orNone(strings.Join(suspended, " ")))

	for _, f := range res.Flux {
		if f.Reclaimed > 0 || f.Lost {
			out = append(out, fmt.Sprintf("flux %s: suspended again %d time(s), kept %v", f.Kustomization, f.Reclaimed, !f.Lost))
		}
	}

	holder := "none"
	if l, err := w.kube.CoordinationV1().Leases("flux-system").Get(context.Background(), "ghcr-auth-refresh", metav1.GetOptions{}); err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
		holder = "held"
		if *l.Spec.HolderIdentity == "another-run" {
			holder = "another-run"
		}
	}

	out = append(out, "lease: "+holder)

	verdict := "none"
	if res.Verdict != nil {
		verdict = firstWords(res.Verdict.Sentence(), 14)
	}

	out = append(out, "verdict: "+verdict, fmt.Sprintf("progressed: %t, cancelled: %t", res.Progressed(), res.Cancelled))

	return out
}

// sortRuns sorts each run of consecutive lines with one of the prefixes: the steering taints of
// a step are put on (and taken off) concurrently, in no order the run promises.
func sortRuns(lines []string, prefixes ...string) []string {
	kind := func(l string) string {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				return p
			}
		}

		return ""
	}

	for i := 0; i < len(lines); {
		j := i + 1
		for k := kind(lines[i]); k != "" && j < len(lines) && kind(lines[j]) == k; j++ {
		}

		slices.Sort(lines[i:j])
		i = j
	}

	return lines
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}

	return s
}

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	if len(f) > n {
		return strings.Join(f[:n], " ") + " …"
	}

	return strings.Join(f, " ")
}

// ReadJudged is Read with the credentials in use as the registry judges them: the old one
// refused (revoked), held by the nodes that hold it.
func (w *runWorld) ReadJudged(ctx context.Context, skipProof bool) (plan.Snapshot, plan.Input, error) {
	snap, in, err := w.Read(ctx)
	if err != nil || skipProof || !w.s.revoked {
		return snap, in, err
	}

	var holders []string

	for _, n := range snap.Nodes {
		if n.Talos != nil && n.Talos.ConfiguredDigest == "old" {
			holders = append(holders, n.Name)
		}
	}

	snap.InUse = []plan.CredentialInUse{{Digest: "old", State: plan.CredentialRefused, Detail: "401 Unauthorized", Nodes: holders}}

	return snap, in, nil
}

// Read is the snapshot as the fleet reader reads it, from the fakes: the nodes with their Talos
// facts, the pull secrets, the Kustomizations — and, as the real reader, no judgement of the
// credentials in use (ReadJudged asks the registry).
func (w *runWorld) Read(context.Context) (plan.Snapshot, plan.Input, error) {
	w.world.mu.Lock()
	defer w.world.mu.Unlock()

	w.relists++

	snap := plan.Snapshot{TakenAt: w.clock.Now(), APIEndpoint: ipOf(w.s.endpoint), ClusterUID: "uid-cluster"}

	for _, name := range sortedKeys(w.nodes) {
		n := object.FromNode(w.nodes[name])
		version := "v1.13.9"
		if slices.Contains(w.s.live, name) {
			version = "v1.14.0"
		}

		n.Talos = &plan.TalosFacts{Version: version, ConfiguredDigest: digestOf(w.active, name), StagedDigest: digestOf(w.staged, name),
			ConfigUpdated: w.configUpdated[name], CRIStarted: w.criStarted[name]}
		snap.Nodes = append(snap.Nodes, n)
	}

	for _, name := range sortedKeys(w.secrets) {
		ns, secret, _ := strings.Cut(name, "/")
		role := plan.RoleConsumer
		if name == "flux-system/ghcr-auth" {
			role = plan.RoleRoot
		}

		snap.Secrets = append(snap.Secrets, plan.SecretObs{Namespace: ns, Name: secret, Role: role, Exists: true, Type: "kubernetes.io/dockerconfigjson",
			Digest: w.revision(w.secrets[name])})
	}

	for _, k := range w.fx.cfg.FluxSuspend {
		snap.Kustomizations = append(snap.Kustomizations, plan.KustomizationObs{Namespace: k.Namespace, Name: k.Name, Exists: true, UID: "uid-" + k.Name,
			Suspended: w.suspended[k.Namespace+"/"+k.Name]})
	}

	return snap, w.input(), nil
}

func (w *runWorld) revision(held string) string {
	if held == "new" {
		return w.fx.cred.PullSecretRevision()
	}

	return "rev-old"
}

func (w *runWorld) input() plan.Input {
	return plan.Input{
		Now: w.clock.Now(), TTL: time.Hour, CredentialRevision: w.fx.cred.Revision(), PullSecretRevision: w.fx.cred.PullSecretRevision(),
		AuthDigest: "new", Registry: "ghcr.io", ConfigDigest: w.fx.cfg.Digest, AutoscalerPolicy: "deselect", Exclude: w.s.old,
		Timing: plan.Timing{ExpectedNodeTime: 6 * time.Minute, ExpectedLiveTime: 30 * time.Second, WorkerParallelism: 1, LiveParallelism: 10,
			DrainTimeout: 45 * time.Minute, Reserve: 2 * time.Minute},
	}
}

func (w *runWorld) Provisioning(context.Context) (*plan.AutoscalerObs, error) { return nil, nil }

func (w *runWorld) ClusterUID(context.Context) (string, error) { return "uid-cluster", nil }

func (w *runWorld) Talos(context.Context) (Talos, Etcd, error) {
	return fakeTalos{w.world}, runEtcd{w.world}, nil
}

// runEtcd is a healthy etcd: every control plane of the world a voting member.
type runEtcd struct{ w *world }

func (e runEtcd) Etcd(context.Context, string) (*plan.EtcdView, error) {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()

	v := &plan.EtcdView{}
	for _, name := range sortedKeys(e.w.nodes) {
		if strings.HasPrefix(name, "cp") {
			v.Members = append(v.Members, plan.EtcdMember{Hostname: name})
		}
	}

	return v, nil
}

func (w *runWorld) fail(port string) error {
	w.world.mu.Lock()
	defer w.world.mu.Unlock()

	w.record("%s", port)

	if w.s.fails[strings.Fields(port)[0]] {
		return fmt.Errorf("%s failed (the script's fault)", strings.Fields(port)[0])
	}

	return nil
}

type runRegistry struct{ w *runWorld }

func (r runRegistry) Prove(context.Context) error               { return r.w.fail("prove") }
func (r runRegistry) Control(context.Context, *plan.Plan) error { return nil }
func (r runRegistry) Retry() credential.Retry                   { return credential.Retry{} }
func (r runRegistry) HeldByNodes(context.Context, string) (func(context.Context) []plan.CredentialInUse, error) {
	return nil, nil
}

type runAdmission struct{ w *runWorld }

func (a runAdmission) Preflight(context.Context) error                   { return a.w.fail("preflight") }
func (a runAdmission) ProbeAdmissible(context.Context, *plan.Plan) error { return nil }
func (a runAdmission) Probe(*plan.Plan) plan.Probe {
	return plan.Probe{Image: "ghcr.io/ghcrsync/private-probe:v1", Namespace: "ghcrsync-probe"}
}

type runWatches struct{}

var errNoWatch = errors.New("the fakes have no watch: reads go to the nodes")

func (runWatches) WatchNodes(context.Context, time.Duration) (NodeWatch, error) {
	return nil, errNoWatch
}

func (runWatches) WatchProbes(context.Context, string, time.Duration) (ProbeWatch, error) {
	return nil, errNoWatch
}

func (runWatches) CASPatchFrom(context.Context, *corev1.Node, string, int, func(*corev1.Node) error,
	func(*corev1.Node) map[string]any, func(int)) (*corev1.Node, error) {
	return nil, errNoWatch
}

type runFlux struct{ w *runWorld }

func (f runFlux) Suspend(_ context.Context, ns, name, _, request string) (bool, error) {
	if err := f.w.fail("suspend " + ns + "/" + name); err != nil {
		return false, err
	}

	f.w.world.mu.Lock()
	defer f.w.world.mu.Unlock()

	f.w.suspended[ns+"/"+name], f.w.requested[ns+"/"+name] = true, request

	return true, nil
}

func (f runFlux) Resume(_ context.Context, ns, name, _ string) (bool, error) {
	if err := f.w.fail("resume " + ns + "/" + name); err != nil {
		return false, err
	}

	f.w.world.mu.Lock()
	defer f.w.world.mu.Unlock()

	gone := !f.w.suspended[ns+"/"+name]
	f.w.suspended[ns+"/"+name] = false

	return gone, nil
}

// Kustomization: kustomize-controller answers a suspension's request at once, recorded once
// ("fail taken": it never does); "lifted N": someone lifts the suspension at each of the next N
// reads after it was first taken.
func (f runFlux) Kustomization(_ context.Context, ns, name string) (plan.KustomizationObs, error) {
	f.w.world.mu.Lock()
	defer f.w.world.mu.Unlock()

	k := ns + "/" + name
	if f.w.suspended[k] && f.w.taken[k] != "" && f.w.lifts > 0 {
		f.w.lifts--
		f.w.suspended[k] = false
		f.w.record("-- someone lifts the suspension of %s (flux resume)", k)
	}

	obs := plan.KustomizationObs{Namespace: ns, Name: name, Exists: true, UID: "uid-" + name, Suspended: f.w.suspended[k]}
	if request := f.w.requested[k]; request != "" && !f.w.s.fails["taken"] && obs.Suspended {
		obs.Handled = request
		if f.w.taken[k] != request {
			f.w.taken[k] = request
			f.w.record("taken %s", k)
		}
	}

	return obs, nil
}

type runLeases struct{ w *runWorld }

func (runLeases) Lease(context.Context, string, string) (*plan.Lease, error) { return nil, nil }
func (runLeases) ReleaseLease(context.Context, string, string, string) (bool, error) {
	return false, nil
}
func (l runLeases) ServerNow() (time.Time, bool) { return l.w.clock.Now(), true }

type runEvents struct{}

func (runEvents) Record(context.Context, object.Ref, string, string, bool) error { return nil }

// runLeasing takes the run Lease on the fake clientset, on the machine's clock (its heartbeat
// runs beside the run: on the fake clock its waits would move the run's time on).
type runLeasing struct{ w *runWorld }

func (l runLeasing) Acquire(ctx context.Context, t LeaseTerms) (RunLease, error) {
	l.w.world.mu.Lock()
	l.w.record("lease acquire")
	l.w.world.mu.Unlock()

	t.Clock, t.Heartbeat = clock.System, 5*time.Millisecond

	held, err := lease.Acquire(ctx, l.w.kube, lease.Options(t))
	if err != nil {
		return nil, err
	}

	held.Start(ctx)
	l.w.lease = held

	return held, nil
}

// runSecrets is the fan-out over the world's pull secrets: each write recorded before it, as
// fanout's (its Record), and the Lease asserted.
type runSecrets struct{ w *runWorld }

func (s runSecrets) Templates(context.Context, *plan.Plan, secretwrite.Options) []secretwrite.Result {
	return nil
}

func (s runSecrets) Consumers(ctx context.Context, p *plan.Plan, o secretwrite.Options) []secretwrite.Result {
	var out []secretwrite.Result

	for _, sp := range p.Secrets {
		if sp.Role != plan.RoleConsumer {
			continue
		}

		out = append(out, s.write(ctx, sp, o))
	}

	return out
}

func (s runSecrets) Root(ctx context.Context, p *plan.Plan, o secretwrite.Options, heldBack string) []secretwrite.Result {
	var out []secretwrite.Result

	for _, sp := range p.Secrets {
		if sp.Role != plan.RoleRoot {
			continue
		}

		if heldBack != "" {
			s.w.world.mu.Lock()
			s.w.record("root held back: %s", firstWords(heldBack, 12))
			s.w.world.mu.Unlock()

			out = append(out, secretwrite.Result{Namespace: sp.Namespace, Secret: sp.Secret, Role: sp.Role, Outcome: secretwrite.HeldBack, Message: heldBack})

			continue
		}

		out = append(out, s.write(ctx, sp, o))
	}

	return out
}

func (s runSecrets) write(ctx context.Context, sp plan.SecretPlan, o secretwrite.Options) secretwrite.Result {
	r := secretwrite.Result{Namespace: sp.Namespace, Secret: sp.Secret, Role: sp.Role, Outcome: secretwrite.Unchanged}
	if sp.Action != plan.SecretUpdate && sp.Action != plan.SecretCreate {
		return r
	}

	if err := o.Assert(ctx); err != nil {
		r.Outcome, r.Message = secretwrite.Failed, err.Error()

		return r
	}

	if err := o.Record(sp.Namespace, sp.Secret, sp.Role, "writing"); err != nil {
		r.Outcome, r.Message = secretwrite.Failed, err.Error()

		return r
	}

	s.w.world.mu.Lock()
	defer s.w.world.mu.Unlock()

	s.w.record("write %s %s/%s", sp.Role, sp.Namespace, sp.Secret)
	s.w.secrets[sp.Namespace+"/"+sp.Secret] = "new"
	r.Outcome = secretwrite.Written

	return r
}
