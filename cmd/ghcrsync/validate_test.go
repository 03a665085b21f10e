package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/config/examples"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// `ghcrsync validate` checks a configuration with no cluster to reach (its kubeconfig points
// nowhere): valid with the age key (the credential decrypted and checked), valid with a warning
// without one (the SOPS file's structure only), and invalid — exit 1, saying what and where —
// for malformed HCL, no probe image, a plaintext credential file, and the wrong age key.
func TestValidate(t *testing.T) {
	sb := sandboxtest.Get(t)
	dir := t.TempDir()

	// No cluster: the kubeconfig's server refuses every connection.
	kc, err := os.ReadFile(sb.Path(sandbox.KubeconfigFile))
	if err != nil {
		t.Fatal(err)
	}

	nowhere := filepath.Join(dir, "kubeconfig")
	lines := strings.Split(string(kc), "\n")

	for i, l := range lines {
		if strings.Contains(l, "server:") {
			lines[i] = "    server: https://127.0.0.1:1"
		}
	}

	_ = os.WriteFile(nowhere, []byte(strings.Join(lines, "\n")), 0o600)

	config := func(edit func(string) string) string {
		d := t.TempDir()

		return sandboxtest.CopyConfig(t, sb, d, func(s string) string {
			s = strings.Replace(s, `"`+sb.Path(sandbox.KubeconfigFile)+`"`, `"`+nowhere+`"`, 1)
			if edit != nil {
				s = edit(s)
			}

			return s
		})
	}

	// The unclosed block appended to the sandbox's configuration opens on the line after it.
	base, err := os.ReadFile(sb.Path(sandbox.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}

	unclosedAt := fmt.Sprintf("ghcrsync.hcl line %d", strings.Count(string(base), "\n")+2)

	plaintext := filepath.Join(dir, "plain.yaml")
	_ = os.WriteFile(plaintext, []byte("stringData:\n  ghcr_dockerconfigjson: '{}'\n"), 0o600)

	otherKey, _, err := secretfile.NewAgeKey()
	if err != nil {
		t.Fatal(err)
	}

	otherKeyFile := filepath.Join(dir, "other.key")
	_ = os.WriteFile(otherKeyFile, otherKey, 0o600)

	for _, tc := range []struct {
		name      string
		cfg       string
		keyFile   string
		code      int
		says      string
		warnings  int
		errorsMin int
		// at is what the line every finding points at holds (its snippet): each finding names
		// its file, line and column.
		at string
	}{
		{name: "valid_decrypted", cfg: config(nil), keyFile: sb.Path(sandbox.AgeKeyFile), code: 0, says: "Success!"},
		{name: "valid_without_a_key", cfg: config(nil), code: 0, says: "Credential not decrypted", warnings: 1, at: "sops_file"},
		{name: "malformed_hcl", cfg: config(func(s string) string { return s + "\nnodes {\n" }), code: 1, says: unclosedAt, errorsMin: 1},
		{name: "no_probe_image", cfg: config(func(s string) string {
			s = strings.Replace(s, `prove     = ["ghcrsync/private-probe:v1"]`, "", 1)
			return strings.Replace(s, `image     = "ghcr.io/ghcrsync/private-probe:v1"`, "", 1)
		}), keyFile: sb.Path(sandbox.AgeKeyFile), code: 1, says: "No runtime probe image", errorsMin: 1, at: `credential "ghcr"`},
		{name: "plaintext_credential_file", cfg: config(func(s string) string {
			return strings.Replace(s, `"`+sb.Path(sandbox.SecretFile)+`"`, `"`+plaintext+`"`, 1)
		}), code: 1, says: "not encrypted with SOPS", errorsMin: 1, at: "sops_file"},
		{name: "wrong_age_key", cfg: config(nil), keyFile: otherKeyFile, code: 1, says: "Invalid credential", errorsMin: 1, at: "sops_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SOPS_AGE_KEY_FILE", tc.keyFile)
			t.Setenv("SOPS_AGE_KEY", "")

			r := ghcrsync(t, "validate", "--config", tc.cfg)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.says) {
				t.Fatalf("exit %d, want %d saying %q:\n%s%s", r.code, tc.code, tc.says, r.stdout, r.stderr)
			}

			js := ghcrsync(t, "validate", "--config", tc.cfg, "--json")

			var v view.ValidateJSON
			if err := json.Unmarshal([]byte(js.stdout), &v); err != nil || v.Valid != (tc.code == 0) || v.WarningCount != tc.warnings || v.ErrorCount < tc.errorsMin {
				t.Fatalf("--json: %v %+v\n%s", err, v, js.stdout)
			}

			for _, d := range v.Diagnostics {
				if d.Range == nil || d.Range.Filename != tc.cfg || d.Range.Start.Line == 0 || d.Snippet == nil || !strings.Contains(d.Snippet.Code, tc.at) {
					t.Errorf("finding %q has no place in %s at %q: range %+v, snippet %+v", d.Summary, tc.cfg, tc.at, d.Range, d.Snippet)
				}
			}
		})
	}
}

// Every example configuration a team starts from validates, with the files it names in place
// (the sandbox's SOPS file and talosconfig stand in for the team's): without a key (the SOPS
// file's structure) and with it (the credential decrypted).
func TestExamplesValidate(t *testing.T) {
	sb := sandboxtest.Get(t)

	entries, err := examples.FS.ReadDir(".")
	if err != nil || len(entries) < 3 {
		t.Fatalf("examples: %v %v", entries, err)
	}

	for _, e := range entries {
		if e.Name() == "sandbox.hcl" { // the sandbox fills it in itself (ghcrsync-sandbox up)
			continue
		}

		t.Run(e.Name(), func(t *testing.T) {
			src, _ := examples.FS.ReadFile(e.Name())
			dir := t.TempDir()
			cfg := filepath.Join(dir, "ghcrsync.hcl")
			_ = os.WriteFile(cfg, src, 0o600)

			secret, _ := os.ReadFile(sb.Path(sandbox.SecretFile))
			talos, _ := os.ReadFile(sb.Path(sandbox.TalosconfigFile))

			for _, m := range regexp.MustCompile(`(sops_file|talosconfig) *= *"([^"]+)"`).FindAllStringSubmatch(string(src), -1) {
				body := secret
				if m[1] == "talosconfig" {
					body = talos
				}

				p := filepath.Join(dir, m[2])
				_ = os.MkdirAll(filepath.Dir(p), 0o700)
				_ = os.WriteFile(p, body, 0o600)
			}

			for _, key := range []string{"", sb.Path(sandbox.AgeKeyFile)} {
				t.Setenv("SOPS_AGE_KEY_FILE", key)
				t.Setenv("SOPS_AGE_KEY", "")

				if r := ghcrsync(t, "validate", "--config", cfg); r.code != 0 {
					t.Fatalf("with key %q: exit %d\n%s%s", key, r.code, r.stdout, r.stderr)
				}
			}
		})
	}
}

// validate --list-inputs names the configuration, then each SOPS file it reads, relative to the
// working directory — also files that do not exist yet (a pull request adds them), where
// validate itself fails.
func TestValidateListsItsInputs(t *testing.T) {
	t.Chdir("../..")

	var out, errOut strings.Builder
	if code := run([]string{"validate", "--list-inputs", "--config", "config/examples/tenants.hcl"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}

	want := "config/examples/tenants.hcl\nconfig/examples/clusters/prod/ghcr-secret.enc.yaml\n" +
		"config/examples/clusters/prod/team-a-ghcr.enc.yaml\nconfig/examples/clusters/prod/team-b-ghcr.enc.yaml\n"
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}

	// The control: validate itself refuses the files that are not there.
	if code := run([]string{"validate", "--config", "config/examples/tenants.hcl"}, &out, &errOut); code != 1 {
		t.Fatalf("validate of a configuration whose SOPS files are missing: exit %d", code)
	}
}
