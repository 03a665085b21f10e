package nodetemplate_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
)

const registry = "ghcr.io"

var (
	oldDigest = authdigest.Of("fleet-old", "ghp_old")
	newDigest = authdigest.Of("fleet-new", "ghp_new")
)

func fixture(t *testing.T, name string) []byte {
	t.Helper()

	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}

	return b
}

// hcloud builds an HCLOUD_CLUSTER_CONFIG value: base64 of JSON with the given pools' cloudInit,
// plus fields ghcrsync must keep as they are.
func hcloud(t *testing.T, pools map[string][]byte) []byte {
	t.Helper()

	nodeConfigs := map[string]any{}
	for name, cfg := range pools {
		nodeConfigs[name] = map[string]any{"cloudInit": string(cfg), "labels": map[string]string{"pool": name}, "taints": []any{}}
	}

	js, err := json.MarshalIndent(map[string]any{"imagesForArch": map[string]string{"amd64": "talos-<1.13>"}, "nodeConfigs": nodeConfigs}, "", "   ")
	if err != nil {
		t.Fatal(err)
	}

	return []byte(base64.StdEncoding.EncodeToString(js) + "\n")
}

func TestReadAndRewrite(t *testing.T) {
	doc, legacy, legacyAuth, none := fixture(t, "document.yaml"), fixture(t, "legacy.yaml"), fixture(t, "legacy-auth.yaml"), fixture(t, "none.yaml")
	wrapped := []byte(base64.StdEncoding.EncodeToString(doc))
	wrapped = []byte(string(wrapped[:76]) + "\n" + string(wrapped[76:152]) + "\n" + string(wrapped[152:]) + "\n")

	cases := []struct {
		name      string
		format    string
		value     []byte
		pools     []string
		wantPools []string
		wantForm  string
		wantOld   string // digest before
		rewritten []string
	}{
		{name: "talos, RegistryAuthConfig document", format: "talos", value: doc, wantPools: []string{""}, wantForm: "document", wantOld: oldDigest, rewritten: []string{""}},
		{name: "talos, legacy username/password", format: "talos", value: legacy, wantPools: []string{""}, wantForm: "legacy", wantOld: oldDigest, rewritten: []string{""}},
		{name: "talos, legacy auth field", format: "talos", value: legacyAuth, wantPools: []string{""}, wantForm: "legacy", wantOld: oldDigest, rewritten: []string{""}},
		{name: "talos, no credential yet", format: "talos", value: none, wantPools: []string{""}, wantForm: "none", wantOld: "", rewritten: []string{""}},
		{name: "talos-base64, wrapped lines", format: "talos-base64", value: wrapped, wantPools: []string{""}, wantForm: "document", wantOld: oldDigest, rewritten: []string{""}},
		{name: "hcloud, every pool", format: "hcloud-cluster-config", value: hcloud(t, map[string][]byte{"cx43": doc, "arm": legacy}),
			wantPools: []string{"arm", "cx43"}, wantOld: oldDigest, rewritten: []string{"arm", "cx43"}},
		{name: "hcloud, one pool", format: "hcloud-cluster-config", value: hcloud(t, map[string][]byte{"cx43": doc, "arm": legacy}), pools: []string{"cx43"},
			wantPools: []string{"cx43"}, wantForm: "document", wantOld: oldDigest, rewritten: []string{"cx43"}},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nodetemplate.Read(tc.format, tc.value, tc.pools, registry)
			if err != nil {
				t.Fatal(err)
			}

			var names []string
			for _, p := range got {
				names = append(names, p.Name)

				if p.Digest != tc.wantOld || tc.wantForm != "" && p.Form != tc.wantForm {
					t.Fatalf("pool %q: %+v, want digest %.12s form %s", p.Name, p, tc.wantOld, tc.wantForm)
				}
			}

			if strings.Join(names, ",") != strings.Join(tc.wantPools, ",") {
				t.Fatalf("pools %v, want %v", names, tc.wantPools)
			}

			next, err := nodetemplate.Rewrite(tc.format, tc.value, tc.pools, registry, "fleet-new", "ghp_new")
			if err != nil {
				t.Fatal(err)
			}

			after, err := nodetemplate.Read(tc.format, next, nil, registry)
			if err != nil {
				t.Fatalf("the rewrite does not read back: %v", err)
			}

			for _, p := range after {
				want := tc.wantOld
				if strings.Contains(","+strings.Join(tc.rewritten, ",")+",", ","+p.Name+",") {
					want = newDigest
				}

				if p.Digest != want {
					t.Fatalf("after the rewrite pool %q has %.12s, want %.12s", p.Name, p.Digest, want)
				}
			}

			again, err := nodetemplate.Rewrite(tc.format, next, tc.pools, registry, "fleet-new", "ghp_new")
			if err != nil || !bytes.Equal(again, next) {
				t.Fatalf("a second rewrite with the same credential changed the value (%v)", err)
			}
		})
	}
}

// The rewrite changes the credential and nothing else it can keep: the other documents byte for
// byte (comments included), the base64 layout, the other JSON fields and their spacing.
func TestRewriteKeepsEverythingElse(t *testing.T) {
	doc := fixture(t, "document.yaml")

	next, err := nodetemplate.Rewrite("talos", doc, nil, registry, "fleet-new", "ghp_new")
	if err != nil {
		t.Fatal(err)
	}

	oldDocs, newDocs := strings.Split(string(doc), "\n---\n"), strings.Split(string(next), "\n---\n")
	if len(newDocs) != 3 || newDocs[0] != oldDocs[0] || newDocs[2] != oldDocs[2] {
		t.Fatalf("other documents changed:\n%s", next)
	}

	if strings.Contains(string(next), "ghp_old") || !strings.Contains(newDocs[1], "ghp_new") {
		t.Fatalf("the ghcr.io document was not replaced:\n%s", newDocs[1])
	}

	legacy := fixture(t, "legacy.yaml")

	next, err = nodetemplate.Rewrite("talos", legacy, nil, registry, "fleet-new", "ghp_new")
	if err != nil {
		t.Fatal(err)
	}

	if strings.Contains(string(next), "kind: RegistryAuthConfig") || !strings.Contains(string(next), "keep-me") ||
		!strings.Contains(string(next), "username: fleet-new") {
		t.Fatalf("the legacy form was not kept:\n%s", next)
	}

	wrapped := hcloud(t, map[string][]byte{"cx43": doc})
	js, _ := base64.StdEncoding.DecodeString(strings.TrimSpace(string(wrapped)))

	out, err := nodetemplate.Rewrite("hcloud-cluster-config", wrapped, nil, registry, "fleet-new", "ghp_new")
	if err != nil {
		t.Fatal(err)
	}

	if !bytes.HasSuffix(out, []byte("\n")) || bytes.Count(out, []byte("\n")) != 1 {
		t.Fatalf("base64 layout changed: %q", out[len(out)-10:])
	}

	js2, _ := base64.StdEncoding.DecodeString(strings.TrimSpace(string(out)))
	start := bytes.Index(js, []byte(`"cloudInit"`))

	if !bytes.Equal(js[:start], js2[:start]) {
		t.Fatal("the JSON before the cloudInit changed")
	}

	tailOld, tailNew := js[bytes.Index(js, []byte(`"labels"`)):], js2[bytes.Index(js2, []byte(`"labels"`)):]
	if !bytes.Equal(tailOld, tailNew) {
		t.Fatalf("the JSON after the cloudInit changed:\n%s\n%s", tailOld, tailNew)
	}
}

// CredentialOnly admits exactly what a rotation writes, in each form, and refuses any other
// change of the value.
func TestCredentialOnly(t *testing.T) {
	doc, legacy, none := fixture(t, "document.yaml"), fixture(t, "legacy.yaml"), fixture(t, "none.yaml")
	b64 := func(b []byte) []byte { return []byte(base64.StdEncoding.EncodeToString(b)) }
	cloud := hcloud(t, map[string][]byte{"cx43": doc, "other": legacy})

	for _, c := range []struct {
		name, format string
		value        []byte
		pools        []string
	}{
		{"document", "talos", doc, nil},
		{"legacy", "talos", legacy, nil},
		{"none", "talos", none, nil},
		{"base64", "talos-base64", b64(doc), nil},
		{"hcloud", "hcloud-cluster-config", cloud, []string{"cx43"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rotated, err := nodetemplate.Rewrite(c.format, c.value, c.pools, registry, "fleet-new", "ghp_new")
			if err != nil {
				t.Fatal(err)
			}

			if err := nodetemplate.CredentialOnly(c.format, c.value, rotated, c.pools, registry); err != nil {
				t.Fatalf("a rotation's write refused: %v", err)
			}

			if err := nodetemplate.CredentialOnly(c.format, c.value, c.value, c.pools, registry); err != nil {
				t.Fatalf("no change refused: %v", err)
			}
		})
	}

	tamper := func(format string, value []byte, pools []string, edit func(string) string) []byte {
		rotated, err := nodetemplate.Rewrite(format, value, pools, registry, "fleet-new", "ghp_new")
		if err != nil {
			t.Fatal(err)
		}

		changed := func(a string) string {
			b := edit(a)
			if b == a {
				t.Fatal("the tampering changed nothing")
			}

			return b
		}

		if format == "talos" {
			return []byte(changed(string(rotated)))
		}

		js, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(rotated)))
		if err != nil {
			t.Fatal(err)
		}

		return append(b64([]byte(changed(string(js)))), '\n')
	}

	for _, c := range []struct {
		name, format string
		value        []byte
		pools        []string
		next         []byte
	}{
		{"install_disk", "talos", doc, nil, tamper("talos", doc, nil, func(s string) string { return strings.Replace(s, "/dev/sda", "/dev/sdb", 1) })},
		{"another_registrys_credential", "talos", doc, nil, tamper("talos", doc, nil, func(s string) string { return strings.Replace(s, "keep-me", "stolen", 1) })},
		{"control_plane_endpoint", "talos", doc, nil, tamper("talos", doc, nil, func(s string) string {
			return strings.Replace(s, "https://10.0.0.2:6443", "https://attacker.example:6443", 1)
		})},
		{"another_registry", "talos", doc, nil, []byte(strings.Replace(string(doc), "ghcr.io", "attacker.example", -1))},
		{"not_a_config", "talos", doc, nil, []byte("{")},
		{"another_pool", "hcloud-cluster-config", cloud, []string{"cx43"}, tamper("hcloud-cluster-config", cloud, []string{"cx43"}, func(s string) string {
			return strings.Replace(s, `"pool": "other"`, `"pool": "elsewhere"`, 1)
		})},
		{"another_image", "hcloud-cluster-config", cloud, []string{"cx43"}, tamper("hcloud-cluster-config", cloud, []string{"cx43"}, func(s string) string {
			return strings.Replace(s, `"amd64"`, `"arm64"`, 1)
		})},
	} {
		t.Run("refused_"+c.name, func(t *testing.T) {
			if err := nodetemplate.CredentialOnly(c.format, c.value, c.next, c.pools, registry); err == nil {
				t.Fatal("admitted")
			}
		})
	}
}

// Bad templates are refused with an error naming what is wrong, before anything is written.
func TestMalformedTemplates(t *testing.T) {
	doc := fixture(t, "document.yaml")

	cases := []struct {
		name   string
		format string
		value  []byte
		pools  []string
		want   string
	}{
		{"bad base64", "talos-base64", []byte("not base64!"), nil, "not base64"},
		{"hcloud not base64", "hcloud-cluster-config", []byte("{}"), nil, "not base64"},
		{"hcloud not JSON", "hcloud-cluster-config", []byte(base64.StdEncoding.EncodeToString([]byte("version: v1alpha1"))), nil, "not the hcloud cluster config's JSON"},
		{"no such pool", "hcloud-cluster-config", hcloud(t, map[string][]byte{"cx43": doc}), []string{"arm"}, `no pool "arm"`},
		{"no pool at all", "hcloud-cluster-config", []byte(base64.StdEncoding.EncodeToString([]byte(`{"nodeConfigs":{}}`))), nil, "no nodeConfigs"},
		{"not a Talos config", "talos", []byte("hello: world\n"), nil, "not a Talos machine config"},
		{"pool's config not Talos", "hcloud-cluster-config", hcloud(t, map[string][]byte{"cx43": []byte("#cloud-config\nruncmd: []\n")}), nil, `pool "cx43": not a Talos machine config`},
		{"pools for talos", "talos", doc, []string{"cx43"}, "pools apply to format"},
		{"unknown format", "yaml", doc, nil, "unknown format"},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nodetemplate.Read(tc.format, tc.value, tc.pools, registry)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Read: %v, want %q", err, tc.want)
			}

			if _, err := nodetemplate.Rewrite(tc.format, tc.value, tc.pools, registry, "u", "p"); err == nil {
				t.Fatal("Rewrite accepted it")
			}

			if strings.Contains(err.Error(), "ghp_old") {
				t.Fatalf("the error reveals the credential: %v", err)
			}
		})
	}
}
