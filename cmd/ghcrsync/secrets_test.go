package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// No output of any CLI run in this package, no plan file and no log contains a plaintext
// credential. It runs last in the package (file order), after every other test's output.
func TestNoPlaintextCredentialAnywhere(t *testing.T) {
	sb := sandboxtest.Get(t)
	cfg := sandboxEnv(t, sb)
	dir := t.TempDir()
	out := filepath.Join(dir, "plan.out")

	for _, args := range [][]string{
		{"plan", "--config", cfg, "--out", out},
		{"plan", "--config", cfg, "--json"},
		{"show", out},
		{"show", "--json", out},
	} {
		if r := ghcrsync(t, args...); r.code != 0 {
			t.Fatalf("%v: %d %s", args, r.code, r.stderr)
		}
	}

	secrets := []string{sb.OldCredential().Password, sb.NewCredential().Password}
	check := func(what, text string) {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s contains a plaintext credential", what)
			}
		}
	}

	if len(outputs) < 10 {
		t.Fatalf("only %d outputs collected: did the other tests run?", len(outputs))
	}

	for i, o := range outputs {
		check("CLI output #"+string(rune('0'+i%10)), o)
	}

	plan, _ := os.ReadFile(out)
	check("the plan file", string(plan))

	files := 0
	_ = filepath.WalkDir(sb.Dir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(p, ".log") || strings.HasSuffix(p, ".out")) {
			return nil
		}

		b, _ := os.ReadFile(p)
		check(p, string(b))
		files++

		return nil
	})

	if files < 4 {
		t.Fatalf("only %d log files checked", files)
	}

	// The secret file itself must not hold them in the clear either.
	enc, _ := os.ReadFile(sb.Path(sandbox.SecretFile))
	check("secret.enc.yaml", string(enc))
}
