// Package security tests ghcrsync's trust boundaries on the sandbox: hostile strings from the
// cluster cannot drive a CI log or a terminal, a plan made for one cluster is refused by
// another, the pull secrets receive only the configured registry's entry, every step leaves a
// Kubernetes Event, and no byte ghcrsync writes holds the credential.
package security

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/plan"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 2, Autoscaled: 0, Seed: 12})
}

// testUser is the kube identity the tests' configurations use (a system:masters member of its
// own, so the audit log tells ghcrsync's writes from the sandbox's).
const testUser = "ghcrsync-security-test"

// outputs collects every byte any ghcrsync run in this package printed, for the hygiene scan.
var (
	outputsMu sync.Mutex
	outputs   []string
)

type result struct {
	code           int
	stdout, stderr string
}

func env(sb *sandbox.Sandbox, home string) []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}
}

func ghcrsync(t *testing.T, sb *sandbox.Sandbox, args ...string) result {
	t.Helper()

	var r result
	r.code, r.stdout, r.stderr = sandboxtest.Run(t, sb, args...)

	outputsMu.Lock()
	outputs = append(outputs, r.stdout, r.stderr)
	outputsMu.Unlock()

	return r
}

// config writes the sandbox's ghcrsync.hcl into a folder of the test's with absolute paths,
// the test's own kube identity, and edit applied.
func config(t *testing.T, sb *sandbox.Sandbox, edit func(string) string) string {
	t.Helper()

	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")

	if err := sb.WriteKubeconfig(kc, testUser, "system:masters"); err != nil {
		t.Fatal(err)
	}

	return sandboxtest.CopyConfig(t, sb, dir, func(s string) string {
		s = strings.Replace(s, `"`+sb.Path(sandbox.KubeconfigFile)+`"`, `"`+kc+`"`, 1)
		if edit != nil {
			s = edit(s)
		}

		return s
	})
}

func kubeState(text string) string {
	return regexpReplaceState(text, "state {\n  backend   = \"kubernetes\"\n  namespace = \"flux-system\"\n  secret    = \"ghcrsync-state\"\n}")
}

func regexpReplaceState(text, block string) string {
	i := strings.Index(text, "state {")
	j := strings.Index(text[i:], "}")

	return text[:i] + block + text[i+j+1:]
}

// hostile is what anyone who can patch a Node (its own kubelet can) or write the Lease may
// plant: GitHub Actions workflow commands on lines of their own, terminal escapes, a carriage
// return that rewrites the line a person reads, a direction override, invalid UTF-8.
const hostile = "::error title=pwned::owned\n::add-mask::x\r\x1b[31mred\x1b[0m\x1b]0;title\a \u202e\xff::warning::end ##[add-mask]legacy\x7fdel\u0085c1"

// Every output line of every command, with hostile values in the owner and phase annotations
// and as the Lease holder: no line begins with "::", nothing reaches the terminal as a control
// character, and the values are shown (escaped), not dropped.
func TestHostileClusterStrings(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	cfg := config(t, sb, nil)

	sandboxtest.PatchNode(t, kube, "prod-worker-2", map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		object.OwnerAnnotation: hostile, object.PhaseAnnotation: hostile,
	}}})

	now := metav1.NewMicroTime(time.Now())
	_, err := kube.CoordinationV1().Leases(sandbox.LeaseNamespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: sandbox.LeaseName, Namespace: sandbox.LeaseNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(hostile), LeaseDurationSeconds: ptr.To(int32(3600)), RenewTime: &now, AcquireTime: &now},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = kube.CoordinationV1().Leases(sandbox.LeaseNamespace).Delete(ctx, sandbox.LeaseName, metav1.DeleteOptions{})
		sandboxtest.PatchNode(t, kube, "prod-worker-2", map[string]any{"metadata": map[string]any{"annotations": map[string]any{
			object.OwnerAnnotation: nil, object.PhaseAnnotation: nil,
		}}})
	})

	stored, err := kube.CoreV1().Nodes().Get(ctx, "prod-worker-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	planFile := filepath.Join(t.TempDir(), "hostile.plan")

	var all []string

	for _, args := range [][]string{
		{"plan", "--config", cfg, "--out", planFile},
		{"plan", "--config", cfg, "--json"},
		{"show", planFile},
		{"fences", "--config", cfg},
		{"fences", "--config", cfg, "--json"},
		{"release", "--config", cfg, "--dry-run"},
		{"release", "--config", cfg},
		{"release", "--config", cfg, "--node", "prod-worker-2"},
		{"apply", "--config", cfg, planFile},
		{"apply", "--config", cfg, "--auto-approve"},
		{"state", "list", "--config", cfg},
	} {
		r := ghcrsync(t, sb, args...)
		for _, stream := range []struct{ name, text string }{{"stdout", r.stdout}, {"stderr", r.stderr}} {
			all = append(all, stream.text)

			if bad := unsafeLines(stream.text); len(bad) > 0 {
				t.Errorf("ghcrsync %s: %s has unsafe lines:\n%s", strings.Join(args[:1], " "), stream.name, strings.Join(bad, "\n"))
			}
		}
	}

	// --json output is JSON whatever the strings hold: jq parses it, and the values come back as
	// they were written (a legacy workflow command, DEL and C1 escaped as JSON escapes, not
	// rewritten into invalid ones by the output guard).
	for _, args := range [][]string{{"plan", "--config", cfg, "--json"}, {"fences", "--config", cfg, "--json"}} {
		r := ghcrsync(t, sb, args...)
		if !json.Valid([]byte(r.stdout)) {
			t.Fatalf("ghcrsync %s --json is not JSON:\n%s", args[0], r.stdout)
		}

		jq := exec.Command("jq", "-e", "[.. | strings | select(contains(\"##[add-mask]legacy\\u007fdel\\u0085c1\"))] | length > 0")
		jq.Stdin = strings.NewReader(r.stdout)

		if out, err := jq.CombinedOutput(); err != nil {
			t.Fatalf("ghcrsync %s --json: jq finds no hostile value as written (%v): %s\n%s", args[0], err, out, r.stdout)
		}
	}

	// The Job's progress log (--log-format json) is JSON a line, whatever the strings hold: with
	// the hostile Lease gone, apply runs (and logs) past the hostile fence on prod-worker-2.
	if err := kube.CoordinationV1().Leases(sandbox.LeaseNamespace).Delete(ctx, sandbox.LeaseName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	r := ghcrsync(t, sb, "apply", "--config", cfg, "--auto-approve", "--log-format", "json", "--log-level", "debug")
	logged := 0

	for _, line := range strings.Split(r.stderr, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}

		logged++

		if !json.Valid([]byte(line)) {
			t.Errorf("apply --log-format json wrote a line that is not JSON:\n%s", line)
		}
	}

	if logged == 0 {
		t.Fatalf("apply --log-format json logged no JSON line:\n%s", r.stderr)
	}

	// Negative control: the values were shown, escaped (not dropped, which would pass vacuously).
	joined := strings.Join(all, "")
	for _, want := range []string{`::error title=pwned::owned\n::add-mask::x\r\x1b[31mred\x1b[0m\x1b]0;title\a \u202e`} {
		if !strings.Contains(joined, want) {
			t.Errorf("no output shows the hostile value escaped as %q", want)
		}
	}

	// And the scan itself finds a raw hostile line.
	if len(unsafeLines("ok\n  "+hostile)) != 2 {
		t.Fatalf("unsafeLines misses a hostile line: %q", unsafeLines("ok\n  "+hostile))
	}

	// release left the node that is not ghcrsync's alone.
	n, err := kube.CoreV1().Nodes().Get(ctx, "prod-worker-2", metav1.GetOptions{})
	if err != nil || n.Annotations[object.OwnerAnnotation] != stored.Annotations[object.OwnerAnnotation] ||
		n.Spec.Unschedulable != stored.Spec.Unschedulable {
		t.Fatalf("release touched a fence it does not hold: %v %q", err, n.Annotations)
	}
}

// unsafeLines returns the lines that begin (after blanks) with "::" or hold a control character
// other than a tab, a direction override, or invalid UTF-8.
func unsafeLines(text string) []string {
	var bad []string

	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " \t"), "::") || !utf8.ValidString(line) ||
			strings.ContainsFunc(line, func(r rune) bool {
				return r < 0x20 && r != '\t' || r == 0x7f || r >= 0x80 && r <= 0x9f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
			}) {
			bad = append(bad, fmt.Sprintf("%q", line))
		}
	}

	return bad
}

// A plan made against another cluster — with the same configuration and credential, so its
// authentication is valid — is refused before any write.
func TestPlanFromAnotherCluster(t *testing.T) {
	a := sandboxtest.Get(t)
	b := sandboxtest.Start(t, sandbox.Options{ControlPlanes: 1, Workers: 1, NoWorkloads: true, AutoscalerPaused: true, Seed: 13})

	cfgA := config(t, a, nil)
	cfgB := config(t, a, func(s string) string {
		// A's credential, registry and state, B's cluster and Talos: a kube context switched by mistake.
		bk := filepath.Join(t.TempDir(), "kubeconfig-b")
		if err := b.WriteKubeconfig(bk, testUser, "system:masters"); err != nil {
			t.Fatal(err)
		}

		i := strings.Index(s, "kubeconfig = ")
		j := strings.Index(s[i:], "\n")

		s = s[:i] + `kubeconfig = "` + bk + `"` + s[i+j:]

		return strings.Replace(s, `"`+a.Path("talosconfig")+`"`, `"`+b.Path("talosconfig")+`"`, 1)
	})

	planFile := filepath.Join(t.TempDir(), "b.plan")
	if r := ghcrsync(t, a, "plan", "--config", cfgB, "--out", planFile); r.code != 0 {
		t.Fatalf("plan against B: exit %d\n%s", r.code, r.stderr)
	}

	before := writesBy(t, a)

	r := ghcrsync(t, a, "apply", "--config", cfgA, planFile)
	if r.code != 3 || !strings.Contains(r.stderr, "made for another cluster") || !strings.Contains(r.stderr, "Nothing was changed") ||
		strings.Contains(r.stderr, "not authentic") {
		t.Fatalf("apply of B's plan on A: exit %d, want 1 naming the cluster (its authentication is valid)\n%s", r.code, r.stderr)
	}

	if after := writesBy(t, a); len(after) != len(before) {
		t.Fatalf("the refused apply wrote: %v", after[len(before):])
	}

	if w := writesBy(t, b); len(w) != 0 {
		t.Fatalf("plan wrote to B: %v", w)
	}

	// Negative control: the same plan applies where it was made (B, once B's registry knows
	// A's credential), so the refusal above was the cluster binding and not a broken plan.
	c := a.NewCredential()
	b.Registry().AddCredential(c.Username, c.Password)

	if r := ghcrsync(t, a, "apply", "--config", cfgB, planFile); r.code != 0 {
		t.Fatalf("apply of B's plan on B: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

func writesBy(t *testing.T, sb *sandbox.Sandbox) []string {
	t.Helper()

	return sandboxtest.Mutations(t, sb, testUser)
}

// secretFile puts a SOPS file holding the sandbox's desired ghcr.io credential and another
// registry's entry (which must never reach a pull secret) in place; it returns the secret
// strings to scan for.
func secretFile(t *testing.T, sb *sandbox.Sandbox, user string) []string {
	t.Helper()

	c, err := sb.RotateSecret(user)
	if err != nil {
		t.Fatal(err)
	}

	hubPass := fmt.Sprintf("dckr_pat_%d", time.Now().UnixNano())
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

	doc, _ := json.Marshal(map[string]any{"auths": map[string]any{
		"ghcr.io":   map[string]string{"username": c.Username, "password": c.Password, "auth": b64(c.Username + ":" + c.Password)},
		"docker.io": map[string]string{"username": "hub-user", "password": hubPass, "auth": b64("hub-user:" + hubPass)},
	}})

	enc, err := sb.EncryptSecret(doc)
	if err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(sb.Path(sandbox.SecretFile), enc, 0o600); err != nil {
		t.Fatal(err)
	}

	return []string{
		c.Password, b64(c.Password), b64(c.Username + ":" + c.Password), string(doc), b64(string(doc)),
		hubPass, b64(hubPass), b64("hub-user:" + hubPass),
	}
}

// One full rotation (local state) and a second one killed at its first reboot, then released
// (Kubernetes state): the pull secrets hold only ghcr.io, each step left an Event on its
// object, and nothing ghcrsync wrote or printed holds a secret.
func TestRotationEventsAndHygiene(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	since := time.Now().Add(-time.Second)

	// prod-worker-2 carries another run's fence: it is deselected, as planned (an Event too).
	sandboxtest.PatchNode(t, kube, "prod-worker-2", map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		object.OwnerAnnotation: "0123456789abcdef-other-run-1-abc123",
	}}})

	needles := secretFile(t, sb, "hygiene-one")
	local := config(t, sb, nil)
	planFile := filepath.Join(t.TempDir(), "rotation.plan")

	if r := ghcrsync(t, sb, "plan", "--config", local, "--out", planFile); r.code != 0 {
		t.Fatalf("plan: exit %d\n%s", r.code, r.stderr)
	}

	// prod-worker-2 stays on the old credential (another run's fence): the verdict says so, exit 5.
	if r := ghcrsync(t, sb, "apply", "--config", local, "--log-level", "debug", planFile); r.code != 5 ||
		!strings.Contains(r.stdout, "Do not revoke the old credential yet: it is still used by 1 node (prod-worker-2)") {
		t.Fatalf("apply: exit %d, want 5 naming prod-worker-2\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	onlyTheRegistry(t, kube)

	sandboxtest.PatchNode(t, kube, "prod-worker-2", map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: nil}}})

	// The second rotation, Kubernetes state, killed at its first reboot; then released.
	second := secretFile(t, sb, "hygiene-two")
	needles = append(needles, second...)
	kcfg := config(t, sb, kubeState)
	killedAtReboot(t, sb, kcfg)

	for _, args := range [][]string{{"fences", "--config", kcfg}, {"release", "--config", kcfg}, {"state", "list", "--config", kcfg}} {
		if r := ghcrsync(t, sb, args...); r.code != 0 {
			t.Fatalf("%v: exit %d\n%s\n%s", args, r.code, r.stdout, r.stderr)
		}
	}

	events := ourEvents(t, kube, since)
	assertEvents(t, events)

	// Every byte ghcrsync wrote or printed.
	var written []string

	outputsMu.Lock()
	written = append(written, outputs...)
	outputsMu.Unlock()

	for _, f := range []string{planFile, filepath.Join(filepath.Dir(local), "ghcrsync.state.json")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}

		written = append(written, string(b))
	}

	st, err := kube.CoreV1().Secrets("flux-system").Get(ctx, "ghcrsync-state", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Kubernetes state: %v", err)
	}

	for k, v := range st.Data {
		written = append(written, k, string(v), base64.StdEncoding.EncodeToString(v))
	}

	for k, v := range st.Annotations {
		written = append(written, k, v)
	}

	for _, ev := range events {
		b, _ := json.Marshal(ev)
		written = append(written, string(b))
	}

	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	for _, n := range nodes.Items {
		b, _ := json.Marshal(map[string]any{"annotations": n.Annotations, "labels": n.Labels, "taints": n.Spec.Taints})
		written = append(written, string(b))
	}

	if l, err := kube.CoordinationV1().Leases(sandbox.LeaseNamespace).Get(ctx, sandbox.LeaseName, metav1.GetOptions{}); err == nil {
		b, _ := json.Marshal(l)
		written = append(written, string(b))
	}

	hits := 0

	for i, w := range written {
		for _, n := range needles {
			if strings.Contains(w, n) {
				hits++

				t.Errorf("written item #%d holds a secret form (%d bytes)", i, len(n))
			}
		}
	}

	// Negative control: the scan finds the secret where it must be (a pull secret).
	ps, err := kube.CoreV1().Secrets(sandbox.ConsumerNamespaces[0]).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
	if err != nil || !strings.Contains(string(ps.Data[corev1.DockerConfigJsonKey]), needles[0]) {
		t.Fatalf("the scan's needles are not in the pull secret: %v", err)
	}

	// The node template is the one other place the plaintext belongs: machines boot from it. The
	// second run wrote it before its first node, so it carries that run's credential.
	tpl, err := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Get(ctx, sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if raw, err := base64.StdEncoding.DecodeString(string(tpl.Data[sandbox.TemplateKey])); err != nil || !strings.Contains(string(raw), second[0]) {
		t.Fatalf("the node template does not carry the rotated credential: %v", err)
	}

	t.Logf("hygiene scan: %d items, %d bytes, %d secret forms: %d hits; %d Events", len(written), size(written), len(needles), hits, len(events))
}

func size(xs []string) int {
	n := 0
	for _, x := range xs {
		n += len(x)
	}

	return n
}

// onlyTheRegistry: every pull secret ghcrsync manages holds exactly the ghcr.io entry.
func onlyTheRegistry(t *testing.T, kube kubernetes.Interface) {
	t.Helper()

	targets := [][2]string{{sandbox.RootNamespace, sandbox.RootSecret}}
	for _, ns := range sandbox.ConsumerNamespaces {
		targets = append(targets, [2]string{ns, sandbox.ConsumerSecret})
	}

	for _, tg := range targets {
		s, err := kube.CoreV1().Secrets(tg[0]).Get(context.Background(), tg[1], metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s/%s: %v", tg[0], tg[1], err)
		}

		var doc struct {
			Auths map[string]json.RawMessage `json:"auths"`
		}

		if err := json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &doc); err != nil {
			t.Fatalf("%s/%s: %v", tg[0], tg[1], err)
		}

		var registries []string
		for r := range doc.Auths {
			registries = append(registries, r)
		}

		sort.Strings(registries)

		if strings.Join(registries, ",") != "ghcr.io" {
			t.Errorf("%s/%s holds the entries of %v, want ghcr.io only", tg[0], tg[1], registries)
		}
	}
}

// killedAtReboot runs apply and kills it (SIGKILL) once a node is rebooting.
func killedAtReboot(t *testing.T, sb *sandbox.Sandbox, cfg string) {
	t.Helper()

	cmd := exec.Command(sandboxtest.Binary(t), "apply", "--auto-approve", "--config", cfg)
	cmd.Env = env(sb, t.TempDir())
	out, errb := sandboxtest.KillWhen(t, cmd, "rebooting: node=")

	outputsMu.Lock()
	outputs = append(outputs, out, errb)
	outputsMu.Unlock()
}

// ourEvents lists the Events ghcrsync wrote since.
func ourEvents(t *testing.T, kube kubernetes.Interface, since time.Time) []corev1.Event {
	t.Helper()

	l, err := kube.CoreV1().Events("").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=" + cluster.EventSource})
	if err != nil {
		t.Fatal(err)
	}

	var out []corev1.Event

	for _, ev := range l.Items {
		if !ev.FirstTimestamp.Time.Before(since) {
			out = append(out, ev)
		}
	}

	return out
}

// assertEvents: every step of the rotations left its Event on the right kind of object.
func assertEvents(t *testing.T, events []corev1.Event) {
	t.Helper()

	seen := map[string]int{}
	for _, ev := range events {
		seen[ev.InvolvedObject.Kind+" "+ev.Reason]++

		if ev.Source.Component != cluster.EventSource || ev.Message == "" {
			t.Errorf("event %s: source %q, message %q", ev.Name, ev.Source.Component, ev.Message)
		}
	}

	for _, want := range []string{
		"Node GhcrsyncClaim", "Node GhcrsyncDrain", "Node GhcrsyncConfigure", "Node GhcrsyncReboot",
		"Node GhcrsyncProve", "Node GhcrsyncRelease", "Node GhcrsyncRotated", "Node GhcrsyncDeselect",
		"Node GhcrsyncFenceReleased",
		"Lease GhcrsyncLeaseAcquired", "Lease GhcrsyncLeaseReleased", "Secret GhcrsyncPullSecretWritten",
	} {
		if seen[want] == 0 {
			t.Errorf("no %s Event; seen %v", want, seen)
		}
	}
}

// A plan sealed by someone who knows the credential but not the SOPS file's age key — the
// person who minted the token — is refused (exit 3, "not authentic") before any write: the plan
// key needs the SOPS data key too. Every key the credential alone gives is tried: the previous
// version's (HKDF of the password), and this version's derivation with no data key. The
// control: the plan ghcrsync made applies.
func TestPlanForgedFromTheCredentialAlone(t *testing.T) {
	sb := sandboxtest.Get(t)
	cfg := config(t, sb, nil)

	c, err := sb.RotateSecret("forger")
	if err != nil {
		t.Fatal(err)
	}

	made := filepath.Join(t.TempDir(), "made.plan")
	if r := ghcrsync(t, sb, "plan", "--config", cfg, "--out", made); r.code != 0 {
		t.Fatalf("plan: exit %d\n%s", r.code, r.stderr)
	}

	p, err := plan.Load(made)
	if err != nil {
		t.Fatal(err)
	}

	// The forger's edit: the control planes become workers (no etcd gate before their reboots).
	for i := range p.Nodes {
		if p.Nodes[i].Role == plan.RoleControlPlane {
			p.Nodes[i].Role = plan.RoleWorker
		}
	}

	hkdfKey := func(ikm []byte, salt, info string) []byte {
		k, _ := hkdf.Key(sha256.New, ikm, []byte(salt), info+"\x00ghcr.io\x00"+c.Username, sha256.Size)
		return k
	}

	for name, key := range map[string][]byte{
		"the previous version's key (the password alone)": hkdfKey([]byte(c.Password), "ghcrsync.dev plan-key salt 2026", "ghcrsync plan authentication v2"),
		"this version's derivation with no data key":      hkdfKey(append([]byte{0}, c.Password...), "ghcrsync.dev plan-key salt 2026-12", "ghcrsync plan authentication v3"),
		"the password as the key":                         []byte(c.Password),
	} {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			forged := filepath.Join(t.TempDir(), "forged.plan")
			if err := plan.Save(forged, p, key); err != nil {
				t.Fatal(err)
			}

			before := writesBy(t, sb)

			r := ghcrsync(t, sb, "apply", "--config", cfg, forged)
			if r.code != 3 || !strings.Contains(r.stderr, "not authentic") || !strings.Contains(r.stderr, "Nothing was changed") {
				t.Fatalf("apply of a plan forged with %s: exit %d, want 3\n%s", name, r.code, r.stderr)
			}

			if after := writesBy(t, sb); len(after) != len(before) {
				t.Fatalf("the refused apply wrote: %v", after[len(before):])
			}
		})
	}

	if r := ghcrsync(t, sb, "apply", "--config", cfg, made); r.code != 0 {
		t.Fatalf("control: apply of the plan ghcrsync made: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}
