package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

func TestMain(m *testing.M) {
	if childMain() {
		return
	}

	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 3, Workers: 3, Autoscaled: 2})
}

// result is one in-process run of the CLI.
type result struct {
	code           int
	stdout, stderr string
}

// outputs collects everything every CLI run printed, for the no-plaintext check.
var outputs []string

func ghcrsync(t *testing.T, args ...string) result {
	t.Helper()

	var out, errb bytes.Buffer

	code := run(args, &out, &errb)
	outputs = append(outputs, out.String(), errb.String())

	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// sandboxEnv points SOPS at the sandbox's age key and returns its config path.
func sandboxEnv(t *testing.T, sb *sandbox.Sandbox) string {
	t.Helper()
	t.Setenv("SOPS_AGE_KEY_FILE", sb.Path(sandbox.AgeKeyFile))
	t.Setenv("SOPS_AGE_KEY", "")

	return sb.Path(sandbox.ConfigFile)
}

func planJSON(t *testing.T, r result) view.PlanJSON {
	t.Helper()

	var p view.PlanJSON
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
		t.Fatalf("plan --json output is not JSON: %v\n%s\n%s", err, r.stdout, r.stderr)
	}

	return p
}

func nodeByName(p view.PlanJSON, name string) (view.NodeJSON, bool) {
	for _, n := range p.Nodes {
		if n.Name == name {
			return n, true
		}
	}

	return view.NodeJSON{}, false
}

// copyConfig copies the sandbox's ghcrsync.hcl into dir with absolute paths, applying edit.
func copyConfig(t *testing.T, sb *sandbox.Sandbox, dir string, edit func(string) string) string {
	t.Helper()

	return sandboxtest.CopyConfig(t, sb, dir, edit)
}

var _ = context.Background
var _ = sandboxtest.Get
