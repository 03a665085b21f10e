package plan

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/state"
)

// Several credentials: each tenant's pull secrets are planned against its own revision and
// judged in its own verdict; the cluster credential's verdict judges the rest. Exit 0 (Clean)
// only when every verdict is safe.
func TestTenantVerdicts(t *testing.T) {
	in := Input{CredentialRevision: "rev-new-0123456789", AuthDigest: "auth-new-0123456789", PullSecretRevision: "ps-new-0123456789",
		Credential: "ghcr", Tenants: []TenantRotation{{Name: "tenant-a", Revision: "ps-a-new-0123456789"}, {Name: "tenant-b", Revision: "ps-b-new-0123456789"}}}
	node := Node{Name: "w1", UID: "u1", InternalIPs: []string{"10.0.0.1"}, Ready: true, BootID: "b1", VerifiedRevision: in.CredentialRevision, VerifiedBoot: "b1",
		Talos: &TalosFacts{Version: "v1.13.9", ConfiguredDigest: in.AuthDigest}}
	secret := func(ns, credential, digest string) SecretObs {
		return SecretObs{Namespace: ns, Name: "ghcr-pull", Role: RoleConsumer, Credential: credential, Exists: true, Type: "kubernetes.io/dockerconfigjson", Digest: digest}
	}

	for _, tc := range []struct {
		name    string
		secrets []SecretObs
		clean   bool
		want    []string // in the sentence
		actions map[string]SecretAction
	}{
		{"every_credential_new", []SecretObs{secret("apps", "", "ps-new-0123456789"), secret("a1", "tenant-a", "ps-a-new-0123456789"),
			secret("b1", "tenant-b", "ps-b-new-0123456789")}, true,
			[]string{"ghcr: The old credential is no longer used", "tenant-a: safe to revoke its old credential: all 1", "tenant-b: safe to revoke"},
			map[string]SecretAction{"apps": SecretNoOp, "a1": SecretNoOp, "b1": SecretNoOp}},
		{"one_tenant_left_on_its_old", []SecretObs{secret("apps", "", "ps-new-0123456789"), secret("a1", "tenant-a", "ps-a-new-0123456789"),
			secret("b1", "tenant-b", "ps-b-old")}, false,
			[]string{"ghcr: The old credential is no longer used", "tenant-a: safe", "tenant-b: do not revoke its old credential yet: it is still used by 1 pull secret (b1/ghcr-pull)"},
			map[string]SecretAction{"b1": SecretUpdate}},
		// A tenant's secret holding the cluster credential is not in sync: each holds its own.
		{"a_tenant_secret_holding_the_cluster_credential", []SecretObs{secret("a1", "tenant-a", "ps-new-0123456789"), secret("b1", "tenant-b", "ps-b-new-0123456789")},
			false, []string{"tenant-a: do not revoke"}, map[string]SecretAction{"a1": SecretUpdate}},
		// And the cluster's own secret holding a tenant's: the cluster credential is not clean.
		{"a_cluster_secret_holding_a_tenant_credential", []SecretObs{secret("apps", "", "ps-a-new-0123456789")}, false,
			[]string{"ghcr: Do not revoke the old credential yet: it is still used by 1 pull secret (apps/ghcr-pull).", "tenant-a: safe to revoke its old credential: all 0"},
			map[string]SecretAction{"apps": SecretUpdate}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Make(Snapshot{Nodes: []Node{node}, Secrets: tc.secrets}, in)

			if p.Verdict.Clean() != tc.clean || p.SafeToRevoke() != tc.clean {
				t.Fatalf("clean %v, want %v: %s", p.Verdict.Clean(), tc.clean, p.Verdict.Sentence())
			}

			if len(p.Verdict.Tenants) != 2 || p.Verdict.Credential != "ghcr" || p.Verdict.Tenants[1].Credential != "tenant-b" {
				t.Fatalf("verdicts %+v: want ghcr's with tenant-a's and tenant-b's", p.Verdict)
			}

			for _, w := range tc.want {
				if !strings.Contains(p.Verdict.Sentence(), w) {
					t.Errorf("verdict lacks %q:\n%s", w, p.Verdict.Sentence())
				}
			}

			for _, sp := range p.Secrets {
				if want, ok := tc.actions[sp.Namespace]; ok && sp.Action != want {
					t.Errorf("%s/%s (%s): %s, want %s", sp.Namespace, sp.Secret, sp.Credential, sp.Action, want)
				}
			}
		})
	}
}

// A tenant's secret another manager put the old credential back in during the run is named in
// that tenant's verdict (not the cluster credential's).
func TestTenantPutBackNamedInItsVerdict(t *testing.T) {
	at := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	in := Input{CredentialRevision: "rev", AuthDigest: "auth", PullSecretRevision: "ps", Credential: "ghcr",
		Tenants: []TenantRotation{{Name: "tenant-b", Revision: "ps-b"}}, Rotation: &state.Rotation{Started: at}}
	s := SecretObs{Namespace: "b1", Name: "ghcr-pull", Role: RoleConsumer, Credential: "tenant-b", Exists: true, Type: "kubernetes.io/dockerconfigjson", Digest: "ps-b-old",
		Writers: []Writer{{Manager: "ksail", Operation: "Update", At: at.Add(time.Minute)}}}

	v := Inventory(Snapshot{Nodes: []Node{{Name: "w1", UID: "u1", InternalIPs: []string{"10.0.0.1"}, Ready: true, BootID: "b", VerifiedRevision: "rev", VerifiedBoot: "b",
		Talos: &TalosFacts{Version: "v1.13.9", ConfiguredDigest: "auth"}}}, Secrets: []SecretObs{s}}, in)

	if !v.SafeToRevoke || v.Clean() || v.Tenants[0].SafeToRevoke {
		t.Fatalf("cluster safe %v, clean %v: want the cluster's safe and tenant-b's not", v.SafeToRevoke, v.Clean())
	}

	if still := v.Tenants[0].Still(); len(still) != 1 || !strings.Contains(still[0].Why, "ksail wrote it") || !strings.Contains(still[0].Next, "stop ksail") {
		t.Fatalf("tenant-b's verdict %+v: want ksail named", still)
	}
}

// A saved plan's tenant fields are sealed with the rest: moving a pull secret to another
// tenant's credential (which would write that tenant's credential into it) breaks the seal; the
// control, the same bytes untouched, verifies.
func TestTenantFieldsAreSealed(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	p := Make(Snapshot{Secrets: []SecretObs{{Namespace: "a1", Name: "ghcr-pull", Role: RoleConsumer, Credential: "tenant-a"}}},
		Input{Now: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC), TTL: time.Hour, Credential: "ghcr",
			Tenants: []TenantRotation{{Name: "tenant-a", Revision: "ra"}, {Name: "tenant-b", Revision: "rb"}}})

	data, err := Encode(p, key)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name      string
		edit      func(string) string
		authentic bool
	}{
		{"untouched", func(s string) string { return s }, true},
		{"a_secret_moved_to_another_tenant", func(s string) string {
			return regexp.MustCompile(`"credential":\s*"tenant-a"`).ReplaceAllString(s, `"credential": "tenant-b"`)
		}, false},
		{"a_tenant_revision_changed", func(s string) string {
			return regexp.MustCompile(`"revision":\s*"rb"`).ReplaceAllString(s, `"revision": "rx"`)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edited := tc.edit(string(data))
			if !tc.authentic && edited == string(data) {
				t.Fatal("the edit changed nothing: the case tests nothing")
			}

			got, err := Decode(withChecksum(t, edited), "plan.out") // as one who edits a plan does

			if err != nil {
				t.Fatal(err)
			}

			if got.Authentic(key) != tc.authentic {
				t.Fatalf("authentic %v, want %v", got.Authentic(key), tc.authentic)
			}
		})
	}
}

// withChecksum recomputes a plan file's checksum (anyone can: it only tells a damaged file).
func withChecksum(t *testing.T, file string) []byte {
	t.Helper()

	var env map[string]json.RawMessage
	if err := json.Unmarshal([]byte(file), &env); err != nil {
		t.Fatal(err)
	}

	var body bytes.Buffer
	if err := json.Compact(&body, env["plan"]); err != nil {
		t.Fatal(err)
	}

	sum := sha256.Sum256(body.Bytes())
	env["checksum"], _ = json.Marshal("sha256:" + hex.EncodeToString(sum[:]))

	out, _ := json.Marshal(env)

	return out
}

// A pull secret another ghcrsync configuration marked is listed among the other owners, by that
// configuration's name; one this configuration marked, or unmarked, is not.
func TestAnotherConfigurationIsListedAsAnOwner(t *testing.T) {
	s := Snapshot{Secrets: []SecretObs{
		{Namespace: "a1", Name: "ghcr-pull", Role: RoleConsumer, Exists: true, OtherConfiguration: `ghcrsync configuration "tenants/rotate" (credential "tenant-a")`},
		{Namespace: "a2", Name: "ghcr-pull", Role: RoleConsumer, Exists: true},
	}}

	owners := OtherOwners(s, nil)
	if len(owners) != 1 || owners[0].Object != "Secret a1/ghcr-pull (consumer)" || !strings.Contains(owners[0].Owner, "tenants/rotate") ||
		!strings.Contains(owners[0].Meaning, "name it in one configuration only") {
		t.Fatalf("other owners %+v: want a1's other configuration only", owners)
	}
}
