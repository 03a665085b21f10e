package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
)

// Every bad input gives one specific message, exit 1, and writes nothing (no plan file).
func TestPlanBadInputs(t *testing.T) {
	sb := sandboxtest.Get(t)

	type setup struct {
		dir string
		env map[string]string
	}

	for _, tc := range []struct {
		name string
		// prepare edits the config text and may write files into dir; it returns extra args.
		prepare func(t *testing.T, s *setup, cfg string) (string, []string)
		want    []string
	}{
		{"hcl_syntax", func(t *testing.T, s *setup, c string) (string, []string) { return c + "\nnodes {\n", nil },
			[]string{"ghcrsync.hcl:", "Unclosed configuration block"}},
		{"unknown_attribute", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, "worker_parallelism", "worker_paralelism", 1), nil
		}, []string{"ghcrsync.hcl:", "Unsupported argument", "worker_paralelism"}},
		{"unknown_block", func(t *testing.T, s *setup, c string) (string, []string) { return c + "\nfleet {}\n", nil },
			[]string{"Unsupported block type", "fleet"}},
		{"bad_duration", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, `drain_timeout         = "2m"`, `drain_timeout         = "two minutes"`, 1), nil
		}, []string{"ghcrsync.hcl:", "Invalid duration", "two minutes"}},
		{"wrong_type", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, "worker_parallelism    = 1", `worker_parallelism    = "one"`, 1), nil
		}, []string{"ghcrsync.hcl:", "worker_parallelism"}},
		{"missing_sops_file", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, sb.Path("secret.enc.yaml"), filepath.Join(s.dir, "absent.enc.yaml"), 1), nil
		}, []string{"ghcrsync.hcl:", "File not found", "absent.enc.yaml"}},
		{"wrong_age_key", func(t *testing.T, s *setup, c string) (string, []string) {
			id, _, _ := secretfile.NewAgeKey()
			p := filepath.Join(s.dir, "other.key")
			_ = os.WriteFile(p, id, 0o600)
			s.env["SOPS_AGE_KEY_FILE"] = p

			return c, nil
		}, []string{"cannot decrypt", "age key"}},
		{"missing_key_path", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, `"ghcr_dockerconfigjson"]`, `"pull_secret"]`, 1), nil
		}, []string{"key path stringData.pull_secret not found"}},
		{"malformed_dockerconfigjson", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, sb.Path("secret.enc.yaml"), encryptFor(t, sb, s.dir, []byte(`{"auths": {`)), 1), nil
		}, []string{"invalid dockerconfigjson", "not JSON"}},
		{"dockerconfigjson_without_registry", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, sb.Path("secret.enc.yaml"), encryptFor(t, sb, s.dir, []byte(`{"auths":{"docker.io":{"username":"u","password":"p"}}}`)), 1), nil
		}, []string{`no auths entry for "ghcr.io"`}},
		{"registry_401", func(t *testing.T, s *setup, c string) (string, []string) {
			unknown := sandbox.DockerConfigJSON(sandbox.Credential{Username: "never-issued", Password: "ghp_never_issued_token"})

			return strings.Replace(c, sb.Path("secret.enc.yaml"), encryptFor(t, sb, s.dir, unknown), 1), nil
		}, []string{"registry proof of ghcrsync/private-probe:v1 failed at the token step: 401", "rejects this credential"}},
		{"registry_unreachable", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, sb.Registry().URL(), "http://127.0.0.1:1", 1), nil
		}, []string{"registry proof", "challenge step", "connection refused"}},
		{"no_prove_targets", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, `prove     = ["ghcrsync/private-probe:v1"]`, `prove     = []`, 1), nil
		}, []string{"has no prove targets", "--skip-proof"}},
		{"unreachable_cluster", func(t *testing.T, s *setup, c string) (string, []string) {
			kc, _ := os.ReadFile(sb.Path("kubeconfig"))
			p := filepath.Join(s.dir, "kubeconfig")
			_ = os.WriteFile(p, []byte(strings.Replace(string(kc), strings.TrimPrefix(sb.EndpointURL(), "https://"), "127.0.0.1:1", 1)), 0o600)

			return strings.Replace(c, sb.Path("kubeconfig"), p, 1), nil
		}, []string{"cannot reach the Kubernetes API at https://127.0.0.1:1", "connection refused"}},
		{"forbidden_identity", func(t *testing.T, s *setup, c string) (string, []string) {
			p := filepath.Join(s.dir, "kubeconfig")
			if err := sb.WriteKubeconfig(p, "nobody-in-particular"); err != nil {
				t.Fatal(err)
			}

			return strings.Replace(c, sb.Path("kubeconfig"), p, 1), nil
		}, []string{"refused ghcrsync's identity", "forbidden"}},
		{"bad_talosconfig", func(t *testing.T, s *setup, c string) (string, []string) {
			p := filepath.Join(s.dir, "talosconfig")
			_ = os.WriteFile(p, []byte("context: [unterminated"), 0o600)

			return strings.Replace(c, sb.Path("talosconfig"), p, 1), nil
		}, []string{"is not a talosconfig"}},
		{"talosconfig_unknown_context", func(t *testing.T, s *setup, c string) (string, []string) {
			return strings.Replace(c, "talos {", "talos {\n  context = \"production\"", 1), nil
		}, []string{`has no context "production"`}},
		{"corrupt_state", func(t *testing.T, s *setup, c string) (string, []string) {
			_ = os.WriteFile(filepath.Join(s.dir, "ghcrsync.state.json"), []byte("{\"format_version\": "), 0o600)

			return c, nil
		}, []string{"state file", "is corrupt"}},
		{"missing_config", func(t *testing.T, s *setup, c string) (string, []string) {
			return c, []string{"--config", filepath.Join(s.dir, "nope.hcl")}
		}, []string{"read configuration", "nope.hcl", "--config FILE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &setup{dir: t.TempDir(), env: map[string]string{}}
			sandboxEnv(t, sb)

			base, _ := os.ReadFile(sb.Path(sandbox.ConfigFile))
			text := string(base)
			for _, f := range []string{"kubeconfig", "talosconfig", "secret.enc.yaml"} {
				text = strings.Replace(text, `"`+f+`"`, `"`+sb.Path(f)+`"`, 1)
			}

			text = strings.Replace(text, `"ghcrsync.state.json"`, `"`+filepath.Join(s.dir, "ghcrsync.state.json")+`"`, 1)

			text, extra := tc.prepare(t, s, text)
			cfg := filepath.Join(s.dir, "ghcrsync.hcl")

			if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}

			for k, v := range s.env {
				t.Setenv(k, v)
			}

			out := filepath.Join(s.dir, "plan.out")
			args := append([]string{"plan", "--config", cfg, "--out", out}, extra...)
			r := ghcrsync(t, args...)

			if r.code != 1 {
				t.Fatalf("exit %d, want 1\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
			}

			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}

			if _, err := os.Stat(out); err == nil {
				t.Error("a failed plan wrote a plan file")
			}

			if r.stdout != "" {
				t.Errorf("a failed plan printed a plan:\n%s", r.stdout)
			}
		})
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

var _ = context.Background
