package planning

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fleet"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/prover"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// world is the plan operation's ports, faked, with a log of every call in order.
type world struct {
	mu  *sync.Mutex // Talos's dry runs are asked in parallel
	log []string
	// answers, by node: Talos's dry run refusal ("" accepts); the API's refusal of a pull
	// secret's dry run (by namespace/name); the probe's admission.
	talosRefuses map[string]string
	writeRefused map[string]error
	admission    error
	proveErr     error
	denied       []string // nodes Talos refused a read of (PermissionDenied)
	cred         *credential.Credential
}

func (w *world) Read(context.Context) (plan.Snapshot, fleet.Memory, error) {
	w.log = append(w.log, "read")

	snap := plan.Snapshot{TakenAt: time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC), APIEndpoint: "10.0.0.1", ClusterUID: "uid-cluster"}

	for _, name := range []string{"w1", "w2", "w3"} {
		n := object.FromNode(&corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
			Status: corev1.NodeStatus{
				NodeInfo:   corev1.NodeSystemInfo{BootID: "boot-" + name},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
				Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.1." + name[1:]}},
			},
		})
		n.Talos = &plan.TalosFacts{Version: "v1.13.9", ConfiguredDigest: "old"}
		n.TalosDenied = slices.Contains(w.denied, name)
		snap.Nodes = append(snap.Nodes, n)
	}

	snap.Secrets = []plan.SecretObs{{Namespace: "apps", Name: "ghcr-pull", Role: plan.RoleConsumer, Exists: true, Type: "kubernetes.io/dockerconfigjson", Digest: "rev-old"}}

	return snap, fleet.Memory{Held: []fleet.Held{{Node: "w1", Cred: w.cred}}, Talos: map[string]talos.Read{}}, nil
}

func (w *world) Prove(context.Context) (prover.Proved, error) {
	w.log = append(w.log, "prove")

	return prover.Proved{Probes: []string{"ghcr.io/acme/probe@sha256:1"}}, w.proveErr
}

func (w *world) ProveTenants(context.Context) (map[string]prover.Proved, error) {
	w.log = append(w.log, "prove tenants")

	return map[string]prover.Proved{}, nil
}

func (w *world) CheckInUse(_ context.Context, held []fleet.Held, _ string, skipped bool) []plan.CredentialInUse {
	if !skipped {
		w.log = append(w.log, "check in use")
	}

	return nil
}

func (w *world) DryRun(_ context.Context, ip string, _ talos.Read, _, _, _ string, live bool) (string, string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()

	node := "w" + strings.TrimPrefix(ip, "10.0.1.")
	w.log = append(w.log, "talos dry run "+node)

	return "reboot", w.talosRefuses[node], nil
}

// calls is the log, the parallel dry runs in node order.
func (w *world) calls() []string {
	out := slices.Clone(w.log)
	for i := 0; i < len(out); {
		j := i
		for j < len(out) && strings.HasPrefix(out[j], "talos dry run ") {
			j++
		}

		if j > i {
			slices.Sort(out[i:j])
			i = j
		} else {
			i++
		}
	}

	return out
}

type writes struct{ w *world }

func (d writes) DryRun(_ context.Context, p *plan.Plan, _ secretwrite.Options) map[string]error {
	d.w.log = append(d.w.log, "write dry run")

	return d.w.writeRefused
}

func (w *world) ProbeAdmissible(_ context.Context, node string, pr plan.Probe) error {
	w.log = append(w.log, "admission "+node+" "+pr.Image)

	return w.admission
}

func (w *world) Credential() (*credential.Credential, error) { return w.cred, nil }

func (w *world) TenantCredential(name string) (*credential.Credential, error) {
	return nil, errors.New("no tenant " + name)
}

func (w *world) Tenants() (map[string]*credential.Credential, error) {
	return map[string]*credential.Credential{}, nil
}

// fixture is a configuration and its real SOPS/age credential.
func fixture(t *testing.T) (*config.Config, *credential.Credential) {
	t.Helper()

	dir := t.TempDir()

	identity, recipient, err := secretfile.NewAgeKey()
	if err != nil {
		t.Fatal(err)
	}

	enc, err := secretfile.Encrypt(secretfile.DockerConfigJSON("ghcr.io", "fleet-new", "ghp_planning_new"), recipient)
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
  prove     = ["acme/probe:v1"]
}
consumer "apps" {
  namespace = "apps"
  secret    = "ghcr-pull"
}
nodes {
  runtime_probe {
    image     = "ghcr.io/acme/probe:v1"
    namespace = "ghcrsync-probe"
  }
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

	return cfg, cred
}

// The plan operation on fakes of its ports: the proof before the read, the dry runs' answers
// planned again, refusals named, nothing planned on a failed proof or a denied probe.
func TestPlan(t *testing.T) {
	cfg, cred := fixture(t)
	refused := apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "ghcr-pull", errors.New("policy no-pull-secrets denied the request"))
	denied := errors.New("the runtime probe pod would not be admitted in namespace ghcrsync-probe: denied by deny-probe-pods")

	for _, tc := range []struct {
		name  string
		world world
		skip  bool
		// want: the calls in order, the nodes' actions, an error's words, a warning's words.
		calls   []string
		actions map[string]plan.Action
		err     string
		isErr   error
		warning string
	}{
		{
			name:    "every node fenced: proof, read, registry, Talos and API dry runs, admission",
			calls:   []string{"prove", "prove tenants", "read", "check in use", "talos dry run w1", "talos dry run w2", "talos dry run w3", "write dry run", "admission w1 ghcr.io/acme/probe@sha256:1"},
			actions: map[string]plan.Action{"w1": plan.ActionFence, "w2": plan.ActionFence, "w3": plan.ActionFence},
		},
		{
			name:    "Talos refuses one node's change: planned again, that node deselected",
			world:   world{talosRefuses: map[string]string{"w2": "unknown field registryAuth"}},
			actions: map[string]plan.Action{"w1": plan.ActionFence, "w2": plan.ActionDeselect, "w3": plan.ActionFence},
		},
		{
			name:    "the API server refuses a pull secret's write: warned of, by object",
			world:   world{writeRefused: map[string]error{"apps/ghcr-pull": refused}},
			actions: map[string]plan.Action{"w1": plan.ActionFence, "w2": plan.ActionFence, "w3": plan.ActionFence},
			warning: "apps/ghcr-pull",
		},
		{
			name:  "the proof fails: nothing read, nothing planned",
			world: world{proveErr: errors.New("401 Unauthorized")},
			calls: []string{"prove"},
			err:   "nothing was planned",
		},
		{
			name:  "the probe would be denied: the cause is wrapped, nothing planned",
			world: world{admission: denied},
			err:   "deny-probe-pods",
			isErr: denied,
		},
		{
			name:  "Talos denied a read: the identity's role, named",
			world: world{denied: []string{"w3"}},
			calls: []string{"prove", "prove tenants", "read"},
			err:   "PermissionDenied: w3",
		},
		{
			name:    "--skip-proof: no proof, no registry question, no Talos dry run",
			skip:    true,
			calls:   []string{"read", "write dry run", "admission w1 ghcr.io/acme/probe:v1"},
			actions: map[string]plan.Action{"w1": plan.ActionFence, "w2": plan.ActionFence, "w3": plan.ActionFence},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.world
			w.cred, w.mu = cred, &sync.Mutex{}
			pl := &Planner{Config: cfg, State: &state.State{Lineage: "l-1"}, Credentials: &w, Clock: clock.NewFake(time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)),
				Fleet: &w, Prover: &w, Talos: func(context.Context) (Talos, error) { return &w, nil }, Writes: writes{&w}, Admission: &w}

			p, err := pl.Plan(context.Background(), Options{SkipProof: tc.skip})

			if got := w.calls(); tc.calls != nil && !slices.Equal(got, tc.calls) {
				t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.calls, "\n  "))
			}

			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one saying %q", err, tc.err)
				}

				if tc.isErr != nil && !errors.Is(err, tc.isErr) {
					t.Fatalf("err = %v does not wrap its cause", err)
				}

				return
			}

			if err != nil {
				t.Fatal(err)
			}

			for _, np := range p.Nodes {
				if want, ok := tc.actions[np.Name]; ok && np.Action != want {
					t.Errorf("node %s: %s (%s), want %s", np.Name, np.Action, np.Sentence, want)
				}
			}

			if tc.warning != "" && !slices.ContainsFunc(p.Warnings, func(s string) bool { return strings.Contains(s, tc.warning) }) {
				t.Errorf("no warning names %s: %q", tc.warning, p.Warnings)
			}
		})
	}
}
