package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/probe"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
	"github.com/ghcrsync/ghcrsync/plan"
)

// bench is one bad-input row's world: its own folder, configuration, kube identity (so the
// apiserver's audit log shows any write it made) and environment.
type bench struct {
	t        *testing.T
	sb       *sandbox.Sandbox
	dir      string
	cfg      string // the configuration file's path
	text     string // its text, before prepare edits it
	env      map[string]string
	identity string
}

func (b *bench) path(name string) string { return filepath.Join(b.dir, name) }

func (b *bench) write(name string, data []byte) string {
	b.t.Helper()

	p := b.path(name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		b.t.Fatal(err)
	}

	return p
}

// edit rewrites the configuration text.
func (b *bench) edit(old, replacement string) {
	b.t.Helper()

	if !strings.Contains(b.text, old) {
		b.t.Fatalf("configuration has no %q", old)
	}

	b.text = strings.Replace(b.text, old, replacement, 1)
}

// savedPlan makes a real plan file with this row's configuration (plan writes nothing).
func (b *bench) savedPlan(extra ...string) string {
	b.t.Helper()
	b.flush()

	out := b.path("saved.plan")
	if r := ghcrsync(b.t, append([]string{"plan", "--config", b.cfg, "--out", out}, extra...)...); r.code != 0 {
		b.t.Fatalf("plan for the row: exit %d\n%s", r.code, r.stderr)
	}

	return out
}

// rewritePlan edits a saved plan's body and re-seals its checksum, as someone editing the
// file with a text editor and sha256sum would.
func (b *bench) rewritePlan(path string, edit func(map[string]any)) {
	b.t.Helper()

	var env struct {
		Format   string          `json:"format"`
		Checksum string          `json:"checksum"`
		Plan     json.RawMessage `json:"plan"`
	}

	raw, _ := os.ReadFile(path)
	if err := json.Unmarshal(raw, &env); err != nil {
		b.t.Fatal(err)
	}

	var body map[string]any
	if err := json.Unmarshal(env.Plan, &body); err != nil {
		b.t.Fatal(err)
	}

	edit(body)

	nb, _ := json.Marshal(body)
	sum := sha256.Sum256(nb)
	env.Plan, env.Checksum = nb, "sha256:"+hex.EncodeToString(sum[:])

	out, _ := json.MarshalIndent(env, "", "  ")
	b.write(filepath.Base(path), out)
}

// forgePlan edits a saved plan's body and re-seals it as an attacker holding only what the
// plan prints would: the checksum, and an authentication code of the given scheme keyed from
// the credential revision in the plan (the v1 derivation, which an older ghcrsync accepted).
func (b *bench) forgePlan(path, scheme string, edit func(map[string]any)) {
	b.t.Helper()
	b.rewritePlan(path, edit)

	var env map[string]json.RawMessage

	raw, _ := os.ReadFile(path)
	if err := json.Unmarshal(raw, &env); err != nil {
		b.t.Fatal(err)
	}

	var body struct {
		Revision string `json:"credential_revision"`
	}

	if err := json.Unmarshal(env["plan"], &body); err != nil || len(body.Revision) != 64 {
		b.t.Fatalf("the plan prints no credential revision (%v)", err)
	}

	rev, _ := hex.DecodeString(body.Revision)
	k := hmac.New(sha256.New, rev)
	k.Write([]byte("ghcrsync plan authentication v1"))
	m := hmac.New(sha256.New, k.Sum(nil))
	m.Write(env["plan"])
	env["mac"], _ = json.Marshal(scheme + ":" + hex.EncodeToString(m.Sum(nil)))

	out, _ := json.MarshalIndent(env, "", "  ")
	b.write(filepath.Base(path), out)
}

func (b *bench) flush() {
	b.t.Helper()

	if err := os.WriteFile(b.cfg, []byte(b.text), 0o600); err != nil {
		b.t.Fatal(err)
	}
}

type badInput struct {
	name string
	// prepare edits b.text, writes files, and returns the command line.
	prepare func(b *bench) []string
	code    int
	// want: stderr names the problem and the next step.
	want []string
	// once: this text appears exactly once (a problem is reported once, with no knock-on).
	once string
}

// Every bad input gets one clear message naming the problem and the next step, its exact exit
// code, and changes nothing: no write by its identity in the apiserver's audit log, no Talos
// write, no plan file, the state file byte for byte as before.
func TestBadInputs(t *testing.T) {
	sb := sandboxtest.Get(t)

	rows := append(configRows(), append(credentialRows(sb), append(clusterRows(sb), append(planRows(), append(stateAndFlagRows(), templateRows(sb)...)...)...)...)...)
	if len(rows) < 30 {
		t.Fatalf("only %d rows", len(rows))
	}

	for i, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			b := newBench(t, sb, fmt.Sprintf("bad-input-%02d", i))
			args := row.prepare(b)
			b.flush()

			for k, v := range b.env {
				t.Setenv(k, v)
			}

			stateBefore, _ := os.ReadFile(b.path("ghcrsync.state.json"))
			talosBefore := totalTalosWrites(sb)

			r := ghcrsync(t, args...)

			if r.code != row.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, row.code, r.stdout, r.stderr)
			}

			for _, w := range row.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}

			if row.once != "" && strings.Count(r.stderr, row.once) != 1 {
				t.Errorf("%q is reported %d times, want once:\n%s", row.once, strings.Count(r.stderr, row.once), r.stderr)
			}

			if n := strings.Count(strings.TrimSpace(r.stderr), "\n") + 1; n > 12 {
				t.Errorf("the error takes %d lines; one clear message expected:\n%s", n, r.stderr)
			}

			if _, err := os.Stat(b.path("out.plan")); err == nil {
				t.Error("a failed command wrote a plan file")
			}

			if after, _ := os.ReadFile(b.path("ghcrsync.state.json")); !bytes.Equal(after, stateBefore) {
				t.Error("a failed command changed the state file")
			}

			if got := totalTalosWrites(sb); got != talosBefore {
				t.Errorf("a failed command made %d Talos write(s)", got-talosBefore)
			}

			assertNoAuditedWrites(t, sb, b.identity)
		})
	}
}

func newBench(t *testing.T, sb *sandbox.Sandbox, identity string) *bench {
	t.Helper()
	sandboxEnv(t, sb)

	b := &bench{t: t, sb: sb, dir: t.TempDir(), env: map[string]string{}, identity: identity}
	b.cfg = b.path("ghcrsync.hcl")

	kubeconfig := b.path("kubeconfig")
	if err := sb.WriteKubeconfig(kubeconfig, identity, "system:masters"); err != nil {
		t.Fatal(err)
	}

	base, err := os.ReadFile(sb.Path(sandbox.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}

	b.text = string(base)
	for _, f := range []string{"talosconfig", "secret.enc.yaml"} {
		b.text = strings.Replace(b.text, `"`+f+`"`, `"`+sb.Path(f)+`"`, 1)
	}

	b.text = strings.Replace(b.text, `"kubeconfig"`, `"`+kubeconfig+`"`, 1)
	b.text = strings.Replace(b.text, `"ghcrsync.state.json"`, `"`+b.path("ghcrsync.state.json")+`"`, 1)

	return b
}

func totalTalosWrites(sb *sandbox.Sandbox) int {
	n := 0
	for _, v := range sb.Fleet().Stats().TalosWrites {
		n += v
	}

	return n
}

// assertNoAuditedWrites: the apiserver's audit log holds no write by identity.
func assertNoAuditedWrites(t *testing.T, sb *sandbox.Sandbox, identity string) {
	t.Helper()

	evs, err := sb.AuditedWrites(identity)
	if err != nil {
		t.Fatal(err)
	}

	for _, ev := range evs {
		switch ev.Verb {
		case "create", "update", "patch", "delete", "deletecollection":
			t.Errorf("wrote to the cluster: %s %s (%d)", ev.Verb, ev.RequestURI, ev.ResponseStatus.Code)
		}
	}
}

func planCmd(b *bench) []string {
	return []string{"plan", "--config", b.cfg, "--out", b.path("out.plan")}
}

// configRows: the configuration, including an unknown attribute in every block.
func configRows() []badInput {
	const next = "Fix the configuration and run the command again; nothing was contacted."

	rows := []badInput{
		{"hcl_syntax", func(b *bench) []string { b.text += "\nnodes {\n"; return planCmd(b) }, 1,
			[]string{"ghcrsync.hcl:", "Unclosed configuration block", next}, ""},
		{"unknown_block", func(b *bench) []string { b.text += "\nfleet {}\n"; return planCmd(b) }, 1,
			[]string{"Unsupported block type", "fleet", next}, ""},
		{"bad_duration", func(b *bench) []string {
			b.edit(`drain_timeout         = "2m"`, `drain_timeout         = "two minutes"`)
			return planCmd(b)
		}, 1, []string{"ghcrsync.hcl:", "Invalid duration", "two minutes", next}, ""},
		{"wrong_type", func(b *bench) []string {
			b.edit("worker_parallelism    = 1", `worker_parallelism    = "one"`)
			return planCmd(b)
		}, 1, []string{"ghcrsync.hcl:", "worker_parallelism", next}, ""},
		{"env_of_an_unset_variable_is_reported_once", func(b *bench) []string {
			b.edit(`sops_file = "`+b.sb.Path("secret.enc.yaml")+`"`, `sops_file = env("GHCRSYNC_TEST_UNSET")`)
			return planCmd(b)
		}, 1, []string{"environment variable GHCRSYNC_TEST_UNSET is not set", next}, "ghcrsync.hcl:"},
		{"missing_config", func(b *bench) []string {
			return []string{"plan", "--config", b.path("nope.hcl")}
		}, 1, []string{"read configuration", "nope.hcl", "--config FILE"}, ""},
	}

	// An unknown attribute (a typo) in every block is an error naming it, never ignored.
	for _, typo := range []struct{ block, open, attr string }{
		{"cluster", "cluster {", "kubeconfg"},
		{"talos", "talos {", "talosconfg"},
		{"credential", `credential "ghcr" {`, "endpont"},
		{"nodes", "nodes {", "worker_paralelism"},
		{"runtime_probe", "runtime_probe {", "imag"},
		{"lease", "lease {", "duraton"},
		{"state", "state {", "backnd"},
		{"liveness", `liveness "github_actions" {`, "repo"},
		{"consumers", "consumers {", "selectr"},
		{"flux_root", "flux_root {", "secrt"},
	} {
		rows = append(rows, badInput{"unknown_attribute_in_" + typo.block, func(b *bench) []string {
			b.edit(typo.open, typo.open+"\n  "+typo.attr+` = "x"`)
			return planCmd(b)
		}, 1, []string{"ghcrsync.hcl:", "Unsupported argument", typo.attr, next}, "Unsupported argument"})
	}

	return rows
}

// credentialRows: the SOPS file and the dockerconfigjson inside it.
func credentialRows(sb *sandbox.Sandbox) []badInput {
	withSecret := func(dockerconfigjson string) func(b *bench) []string {
		return func(b *bench) []string {
			b.edit(sb.Path("secret.enc.yaml"), encryptFor(b.t, sb, b.dir, []byte(dockerconfigjson)))
			return planCmd(b)
		}
	}

	return []badInput{
		{"missing_sops_file", func(b *bench) []string {
			b.edit(sb.Path("secret.enc.yaml"), b.path("absent.enc.yaml"))
			return planCmd(b)
		}, 1, []string{"ghcrsync.hcl:", "File not found", "absent.enc.yaml"}, ""},
		{"wrong_age_key", func(b *bench) []string {
			id, _, _ := secretfile.NewAgeKey()
			b.env["SOPS_AGE_KEY_FILE"] = b.write("other.key", id)
			return planCmd(b)
		}, 1, []string{"cannot decrypt", "use the age key whose recipient the file is encrypted for"}, ""},
		{"sops_file_not_encrypted", func(b *bench) []string {
			b.edit(sb.Path("secret.enc.yaml"), b.write("plain.yaml", []byte("stringData:\n  ghcr_dockerconfigjson: '{}'\n")))
			return planCmd(b)
		}, 1, []string{"is not SOPS-encrypted", "encrypt it with sops"}, ""},
		{"sops_file_edited_after_encryption", func(b *bench) []string {
			enc, _ := os.ReadFile(sb.Path("secret.enc.yaml"))
			i := bytes.Index(enc, []byte("ENC[AES256_GCM,data:")) + len("ENC[AES256_GCM,data:")
			edited := bytes.Clone(enc)
			edited[i] = map[bool]byte{true: 'B', false: 'A'}[edited[i] == 'A'] // still base64, not the ciphertext
			_ = edited
			b.edit(sb.Path("secret.enc.yaml"), b.write("edited.enc.yaml", edited))
			return planCmd(b)
		}, 1, []string{"edited.enc.yaml was damaged or edited after encryption", "restore it from Git"}, ""},
		{"missing_key_path", func(b *bench) []string {
			b.edit(`"ghcr_dockerconfigjson"]`, `"pull_secret"]`)
			return planCmd(b)
		}, 1, []string{"key path stringData.pull_secret not found", "set credential.key"}, ""},
		{"malformed_dockerconfigjson", withSecret(`{"auths": {`), 1, []string{"invalid dockerconfigjson", "not JSON"}, ""},
		{"dockerconfigjson_without_the_registry", withSecret(`{"auths":{"docker.io":{"username":"u","password":"p"}}}`), 1,
			[]string{`no auths entry for "ghcr.io"`}, ""},
		{"dockerconfigjson_auth_not_base64", withSecret(`{"auths":{"ghcr.io":{"auth":"%%%"}}}`), 1,
			[]string{`auths["ghcr.io"].auth is not base64`}, ""},
		{"dockerconfigjson_auth_disagrees", withSecret(`{"auths":{"ghcr.io":{"username":"u","password":"p","auth":"dTp4"}}}`), 1,
			[]string{"username/password and auth disagree"}, ""},
		{"registry_rejects_the_credential", func(b *bench) []string {
			unknown := sandbox.DockerConfigJSON(sandbox.Credential{Username: "never-issued", Password: "ghp_never_issued_token"})
			return withSecret(string(unknown))(b)
		}, 1, []string{"registry proof of ghcrsync/private-probe:v1 failed at the token step: 401", "rejects this credential"}, ""},
		{"registry_unreachable", func(b *bench) []string {
			b.edit(sb.Registry().URL(), "http://127.0.0.1:1")
			return planCmd(b)
		}, 1, []string{"registry proof", "challenge step", "connection refused"}, ""},
		{"registry_names_a_token_realm_elsewhere", func(b *bench) []string {
			// The sandbox registry's challenge names a realm on another host: the password is
			// never sent there.
			realm := strings.Replace(sb.Registry().URL(), "127.0.0.1", "localhost", 1) + "/token"
			sb.Registry().SetRealm(realm)
			b.t.Cleanup(func() { sb.Registry().SetRealm("") })
			return planCmd(b)
		}, 1, []string{"registry proof of ghcrsync/private-probe:v1 failed at the token step", "its host localhost is not trusted",
			"credential.trusted_hosts", "the credential was not sent"}, ""},
		{"liveness_api_url_on_an_untrusted_host", func(b *bench) []string {
			b.edit(`trusted_hosts = ["127.0.0.1"]`, `trusted_hosts = ["ghe.example.com"]`)
			return planCmd(b)
		}, 1, []string{"ghcrsync.hcl:", "Untrusted api_url", "receives the GitHub token", "its host 127.0.0.1 is not trusted"}, ""},
		{"public_probe_image", func(b *bench) []string {
			b.edit(`image     = "ghcr.io/ghcrsync/private-probe:v1"`, `image     = "ghcr.io/`+registry.PublicImage+`"`)
			return planCmd(b)
		}, 1, []string{"registry proof of " + registry.PublicImage, "readable without credentials", "proves nothing: prove a private image"}, ""},
		{"probe_denied_by_an_admission_policy", func(b *bench) []string {
			denyProbes(b)
			return planCmd(b)
		}, 1, []string{"the runtime probe pod would not be admitted in namespace ghcrsync-probe", "deny-probe-pods", "no probes here",
			"Nothing was changed"}, ""},
		{"probe_namespace_missing", func(b *bench) []string {
			b.edit(`namespace = "ghcrsync-probe"`, `namespace = "no-such-namespace"`)
			return planCmd(b)
		}, 1, []string{"the runtime probe pod would not be admitted in namespace no-such-namespace", "not found", "Nothing was changed"}, ""},
		{"no_prove_targets", func(b *bench) []string {
			b.edit(`prove     = ["ghcrsync/private-probe:v1"]`, `prove     = []`)
			return planCmd(b)
		}, 1, []string{"has no prove targets", "--skip-proof"}, ""},
	}
}

// clusterRows: the kubeconfig and talosconfig.
func clusterRows(sb *sandbox.Sandbox) []badInput {
	return []badInput{
		{"unreachable_cluster", func(b *bench) []string {
			kc, _ := os.ReadFile(b.path("kubeconfig"))
			b.write("kubeconfig", []byte(strings.Replace(string(kc), strings.TrimPrefix(sb.EndpointURL(), "https://"), "127.0.0.1:1", 1)))
			return planCmd(b)
		}, 1, []string{"cannot reach the Kubernetes API at https://127.0.0.1:1", "check the kubeconfig's server"}, ""},
		{"forbidden_identity", func(b *bench) []string {
			if err := sb.WriteKubeconfig(b.path("kubeconfig"), b.identity); err != nil {
				b.t.Fatal(err)
			}
			return planCmd(b)
		}, 1, []string{"ghcrsync plan cannot run as " + "bad-input-", "the cluster denies get nodes (cluster-wide)", "ghcrsync rbac --config", "nothing was changed"}, ""},
		{"bad_talosconfig", func(b *bench) []string {
			b.edit(sb.Path("talosconfig"), b.write("talosconfig", []byte("context: [unterminated")))
			return planCmd(b)
		}, 1, []string{"is not a talosconfig"}, ""},
		{"talosconfig_unknown_context", func(b *bench) []string {
			b.edit("talos {", "talos {\n  context = \"production\"")
			return planCmd(b)
		}, 1, []string{`has no context "production"`}, ""},
		{"kubeconfig_flag_of_a_missing_file", func(b *bench) []string {
			return append(planCmd(b), "--kubeconfig", b.path("absent.kubeconfig"))
		}, 1, []string{"--kubeconfig " + "", "absent.kubeconfig does not exist", "leave the flag out"}, ""},
		{"kubeconfig_flag_wins_over_the_file", func(b *bench) []string {
			// The file's kubeconfig is admin; the flag's is an identity with no rights.
			if err := sb.WriteKubeconfig(b.path("flag.kubeconfig"), b.identity); err != nil {
				b.t.Fatal(err)
			}
			return append(planCmd(b), "--kubeconfig", b.path("flag.kubeconfig"))
		}, 1, []string{"ghcrsync plan cannot run as " + "bad-input-", "the cluster denies get nodes"}, ""},
		{"talos_context_flag_wins_over_the_file", func(b *bench) []string {
			return append(planCmd(b), "--talos-context", "production")
		}, 1, []string{`has no context "production"`}, ""},
	}
}

// templateRows: node templates plan cannot use. Each fails the plan (exit 1) naming the block,
// the Secret, the key (and the pool), before anything is written.
func templateRows(sb *sandbox.Sandbox) []badInput {
	b64 := func(s string) []byte { return []byte(base64.StdEncoding.EncodeToString([]byte(s))) }
	hcloud := func(pool, cloudInit string) []byte {
		js, _ := json.Marshal(map[string]any{"nodeConfigs": map[string]any{pool: map[string]any{"cloudInit": cloudInit}}})

		return []byte(base64.StdEncoding.EncodeToString(js))
	}

	// use points the node_template block at default/NAME holding value (nil: no such Secret),
	// with more edits of the configuration as old/new pairs.
	use := func(name string, value []byte, edits ...string) func(b *bench) []string {
		return func(b *bench) []string {
			if value != nil {
				kube := sb.Kube()
				secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Data: map[string][]byte{sandbox.TemplateKey: value}}

				if _, err := kube.CoreV1().Secrets("default").Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
					b.t.Fatal(err)
				}

				b.t.Cleanup(func() {
					_ = kube.CoreV1().Secrets("default").Delete(context.Background(), name, metav1.DeleteOptions{})
				})
			}

			b.edit(`namespace          = "kube-system"
  secret             = "hcloud-cluster-config"`, `namespace          = "default"
  secret             = "`+name+`"`)

			for i := 0; i+1 < len(edits); i += 2 {
				b.edit(edits[i], edits[i+1])
			}

			return planCmd(b)
		}
	}

	named := func(secret string, more ...string) []string {
		return append([]string{`node_template "hcloud-workers"`, "Secret default/" + secret, "key " + sandbox.TemplateKey, "nothing was changed", "docs/node-templates.md"}, more...)
	}

	return []badInput{
		{"template_secret_missing", use("tpl-missing", nil), 1, named("tpl-missing", "the Secret does not exist"), ""},
		{"template_key_missing", use("tpl-key", []byte("x"), `key                = "HCLOUD_CLUSTER_CONFIG"`, `key                = "CLUSTER_CONFIG"`), 1,
			[]string{"Secret default/tpl-key", "has no key CLUSTER_CONFIG (its keys: " + sandbox.TemplateKey + ")"}, ""},
		{"template_bad_base64", use("tpl-b64", []byte("!! not base64 !!")), 1, named("tpl-b64", "the value is not base64"), ""},
		{"template_not_json", use("tpl-json", b64("version: v1alpha1\n")), 1, named("tpl-json", "is not the hcloud cluster config's JSON"), ""},
		{"template_no_such_pool", use("tpl-pool", hcloud("autoscale-cx43", "x"), `pools              = ["autoscale-cx43"]`, `pools              = ["arm-pool"]`), 1,
			named("tpl-pool", `no pool "arm-pool" with a cloudInit in nodeConfigs (pools with one: autoscale-cx43)`), ""},
		{"template_not_a_talos_config", use("tpl-talos", hcloud("autoscale-cx43", "#cloud-config\nruncmd: []\n")), 1,
			named("tpl-talos", `pool "autoscale-cx43": not a Talos machine config`), ""},
		{"template_format_unknown", func(b *bench) []string {
			b.edit(`format             = "hcloud-cluster-config"`, `format             = "cloud-init"`)
			return planCmd(b)
		}, 1, []string{"ghcrsync.hcl:", "Unsupported node template format", `not "cloud-init"`}, ""},
	}
}

// addConsumer is a forger's edit: one more consumer, in a namespace whose identities the new
// plaintext credential would then be written for.
func addConsumer(m map[string]any) {
	secrets, _ := m["secrets"].([]any)
	m["secrets"] = append(secrets, map[string]any{"namespace": "kube-system", "secret": "ghcr-pull", "role": "consumer", "action": "create", "reason": "forged"})
}

// planRows: saved plans that must never be applied.
func planRows() []badInput {
	const again = "Run `ghcrsync plan --out"

	apply := func(b *bench, planFile string) []string { return []string{"apply", "--config", b.cfg, planFile} }

	return []badInput{
		{"plan_edited", func(b *bench) []string {
			p := b.savedPlan()
			raw, _ := os.ReadFile(p)
			b.write("saved.plan", bytes.Replace(raw, []byte(`"action": "fence"`), []byte(`"action": "no-op"`), 1))
			return apply(b, p)
		}, 3, []string{"corrupt or was edited", "checksum mismatch", "ghcrsync plan --out"}, ""},
		{"plan_edited_with_its_checksum_recomputed", func(b *bench) []string {
			p := b.savedPlan()
			b.rewritePlan(p, func(m map[string]any) {
				for _, n := range m["nodes"].([]any) {
					if n := n.(map[string]any); n["role"] == "control-plane" {
						n["role"] = "worker" // would reboot it in parallel with no quorum gate
					}
				}
			})
			return apply(b, p)
		}, 3, []string{"is not authentic", "changed after `ghcrsync plan` made it", "ghcrsync plan --out", "Nothing was changed"}, ""},
		{"plan_forged_from_the_revision_it_prints", func(b *bench) []string {
			p := b.savedPlan()
			b.forgePlan(p, "hmac-sha256+hkdf-v4", addConsumer)
			return apply(b, p)
		}, 3, []string{"is not authentic", "ghcrsync plan --out", "Nothing was changed"}, ""},
		{"plan_forged_in_the_retired_scheme", func(b *bench) []string {
			// The v1 scheme: ghcrsync before the HKDF key accepted exactly this forgery.
			p := b.savedPlan()
			b.forgePlan(p, "hmac-sha256", addConsumer)
			return apply(b, p)
		}, 3, []string{"sealed by an older ghcrsync", "plan authentication is retired", again, "Nothing was changed"}, ""},
		{"plan_truncated", func(b *bench) []string {
			p := b.savedPlan()
			raw, _ := os.ReadFile(p)
			b.write("saved.plan", raw[:len(raw)/2])
			return apply(b, p)
		}, 3, []string{"corrupt or was edited", "ghcrsync plan --out"}, ""},
		{"plan_of_a_future_version", func(b *bench) []string {
			p := b.savedPlan()
			b.rewritePlan(p, func(m map[string]any) { m["format_version"] = "2.0" })
			return apply(b, p)
		}, 3, []string{"format_version 2.0", "run plan again with this version"}, ""},
		{"plan_for_another_cluster", func(b *bench) []string {
			p := b.savedPlan()
			b.rewritePlan(p, func(m map[string]any) { m["cluster_uid"] = "5f0c2a5e-0000-4000-8000-000000000000" })
			return apply(b, p)
		}, 3, []string{"made for another cluster", "check the kubeconfig and context", again, "Nothing was changed"}, ""},
		{"plan_expired", func(b *bench) []string {
			p := b.savedPlan("--expires-in", "1ms")
			time.Sleep(5 * time.Millisecond)
			return apply(b, p)
		}, 3, []string{"it expired at", again, "Nothing was changed"}, ""},
		{"plan_huge", func(b *bench) []string {
			f, err := os.Create(b.path("huge.plan"))
			if err != nil {
				b.t.Fatal(err)
			}
			_ = f.Truncate(65 << 20) // sparse: 65 MiB of zeros
			f.Close()
			return apply(b, b.path("huge.plan"))
		}, 1, []string{"huge.plan is larger than 64 MiB", "ghcrsync plan --out"}, ""},
		{"plan_made_before_the_state_changed", func(b *bench) []string {
			p := b.savedPlan()
			b.write("ghcrsync.state.json", []byte(`{"format_version":"1","lineage":"1111","serial":9,"records":[]}`+"\n"))
			return apply(b, p)
		}, 3, []string{"the state was changed by another operation after the plan was created", again}, ""},
		{"plan_file_missing", func(b *bench) []string { return apply(b, b.path("absent.plan")) }, 1,
			[]string{"read plan file", "absent.plan", "ghcrsync plan --out"}, ""},
		{"show_a_file_that_is_not_a_plan", func(b *bench) []string {
			return []string{"show", b.write("not.plan", []byte(`{"hello":"world"}`))}
		}, 3, []string{"not a plan file", "ghcrsync plan --out"}, ""},
	}
}

// stateAndFlagRows: the state, node names, and flags.
func stateAndFlagRows() []badInput {
	return []badInput{
		{"corrupt_state", func(b *bench) []string {
			b.write("ghcrsync.state.json", []byte("{\"format_version\": "))
			return planCmd(b)
		}, 1, []string{"is corrupt", "restore it from a backup"}, ""},
		{"state_of_a_future_version", func(b *bench) []string {
			b.write("ghcrsync.state.json", []byte(`{"format_version":"7","lineage":"x","serial":1}`))
			return planCmd(b) // fences and release carry on without it (TestRepairWithAnUnreadableState)
		}, 1, []string{`format_version "7"`, "use the ghcrsync version that wrote it"}, ""},
		{"state_push_of_another_lineage", func(b *bench) []string {
			b.write("ghcrsync.state.json", []byte(`{"format_version":"1","lineage":"aaaa","serial":3,"records":[]}`))
			other := b.write("other.json", []byte(`{"format_version":"1","lineage":"bbbb","serial":1,"records":[]}`))
			return []string{"state", "push", "--config", b.cfg, other}
		}, 1, []string{"already holds state lineage aaaa", "pass --force if that is intended"}, ""},
		{"state_rm_of_an_unknown_node", func(b *bench) []string {
			return []string{"state", "rm", "--config", b.cfg, "no-such-node"}
		}, 1, []string{"has no record of no-such-node", "ghcrsync state list"}, ""},
		{"release_of_an_unknown_node", func(b *bench) []string {
			return []string{"release", "--config", b.cfg, "--node", "no-such-node"}
		}, 1, []string{`no ghcrsync fence is held on node "no-such-node"`, "ghcrsync fences"}, ""},
		{"release_force_without_holder", func(b *bench) []string {
			return []string{"release", "--config", b.cfg, "--force"}
		}, 1, []string{"--force needs the holder id", "ghcrsync fences"}, ""},
		{"unknown_flag", func(b *bench) []string { return []string{"plan", "--config", b.cfg, "--bogus"} }, 1,
			[]string{"unknown flag: --bogus", "see `ghcrsync plan --help`"}, ""},
		{"missing_argument", func(b *bench) []string { return []string{"state", "show", "--config", b.cfg} }, 1,
			[]string{"accepts 1 arg(s), received 0", "see `ghcrsync state show --help`"}, ""},
		{"apply_without_a_plan", func(b *bench) []string { return []string{"apply", "--config", b.cfg} }, 1,
			[]string{"apply needs a saved plan", "--auto-approve"}, ""},
		{"bad_expiry", func(b *bench) []string { return []string{"plan", "--config", b.cfg, "--expires-in", "soon"} }, 1,
			[]string{"invalid argument", "--expires-in", "see `ghcrsync plan --help`"}, ""},
		{"unknown_log_level", func(b *bench) []string {
			return []string{"apply", "--config", b.cfg, "--auto-approve", "--log-level", "verbose"}
		}, 1, []string{`unknown --log-level "verbose"`, "trace, debug, info, warn or error"}, ""},
		{"unknown_log_format", func(b *bench) []string {
			return []string{"apply", "--config", b.cfg, "--auto-approve", "--log-format", "yaml"}
		}, 1, []string{`unknown --log-format "yaml"`, "text or json"}, ""},
	}
}

// encryptFor writes a SOPS file holding dockerconfigjson for the sandbox's age key.
func encryptFor(t *testing.T, sb *sandbox.Sandbox, dir string, dockerconfigjson []byte) string {
	t.Helper()

	enc, err := sb.EncryptSecret(dockerconfigjson)
	if err != nil {
		t.Fatal(err)
	}

	p := filepath.Join(dir, "secret.enc.yaml")
	if err := os.WriteFile(p, enc, 0o600); err != nil {
		t.Fatal(err)
	}

	return p
}

// Negative control of the zero-writes check: a write made with a row's identity is seen in the
// audit log.
func TestAuditLogSeesARowsWrites(t *testing.T) {
	sb := sandboxtest.Get(t)
	b := newBench(t, sb, "bad-input-control")
	kube := sandboxtest.KubeFrom(t, b.path("kubeconfig"))

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bad-input-control", Namespace: "default"}}
	if _, err := kube.CoreV1().ConfigMaps("default").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = sb.Kube().CoreV1().ConfigMaps("default").Delete(context.Background(), cm.Name, metav1.DeleteOptions{})
	})

	sandboxtest.Eventually(t, 10*time.Second, "the write in the audit log", func() error {
		evs, err := sb.AuditedWrites(b.identity)
		if err != nil {
			return err
		}

		for _, ev := range evs {
			if ev.Verb == "create" && strings.Contains(ev.RequestURI, "configmaps") {
				return nil
			}
		}

		return fmt.Errorf("%d events, no create", len(evs))
	})
}

// denyProbes installs, for the row, a ValidatingAdmissionPolicy (the API server's own plugin)
// denying every pod in the probe namespace.
func denyProbes(b *bench) {
	b.t.Helper()

	ctx := context.Background()
	api := b.sb.Kube().AdmissionregistrationV1()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-probe-pods"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "no probes here"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": sandbox.ProbeNamespace}}}},
	}

	if _, err := api.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		b.t.Fatal(err)
	}

	if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		b.t.Fatal(err)
	}

	denied := func() bool {
		// The probe's own shape: the probe namespace enforces PodSecurity "restricted".
		pod := probe.Pod("x", plan.Probe{Image: "pause", Namespace: sandbox.ProbeNamespace, ServiceAccount: sandbox.ProbeServiceAccount}, "x")
		_, err := b.sb.Kube().CoreV1().Pods(sandbox.ProbeNamespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

		return err != nil
	}

	b.t.Cleanup(func() {
		_ = api.ValidatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{})
		_ = api.ValidatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{})

		// The API server unloads a policy a moment after its deletion: the next row starts clean.
		sandboxtest.Eventually(b.t, 30*time.Second, "the policy is unloaded", func() error {
			if denied() {
				return fmt.Errorf("still denying")
			}

			return nil
		})
	})

	sandboxtest.Eventually(b.t, 30*time.Second, "the policy denies probe pods", func() error {
		if !denied() {
			return fmt.Errorf("admitted")
		}

		return nil
	})
}
