package security

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// A credential that can pull an image credential.deny names (another tenant's package) fails
// plan with exit 3, naming the image, before anything is planned or saved; the same credential
// with the package's access taken away in the registry (403, as GHCR answers a package not
// granted) plans. The registry is the sandbox's real token-auth registry.
func TestPlanProvesTheCredentialIsIsolated(t *testing.T) {
	sb := sandboxtest.Get(t)

	cred, err := sb.RotateSecret("tenant-a")
	if err != nil {
		t.Fatal(err)
	}

	other := "ghcrsync/app:v1" // the other tenant's package, on the same registry
	dir := t.TempDir()
	cfg := sandboxtest.CopyConfig(t, sb, dir, func(s string) string {
		return strings.Replace(s, "  prove ", "  deny      = [\""+other+"\"]\n  prove ", 1)
	})
	out := filepath.Join(dir, "plan.out")

	code, stdout, stderr := sandboxtest.Run(t, sb, "plan", "--config", cfg, "--out", out)
	if code != 3 || !strings.Contains(stderr, other) || !strings.Contains(stderr, "credential.deny") {
		t.Fatalf("plan with a credential granted %s: exit %d, want 3 naming it\n%s\n%s", other, code, stdout, stderr)
	}

	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a plan was saved for a credential that is not isolated (%v)", err)
	}

	if strings.Contains(stdout+stderr, cred.Password) {
		t.Fatal("the credential's password in plan's output")
	}

	// The control: the package's access taken away, the same configuration plans.
	sb.Registry().DenyRepository(cred.Username, "ghcrsync/app")
	t.Cleanup(func() { sb.Registry().AllowRepository(cred.Username, "ghcrsync/app") })

	if code, stdout, stderr := sandboxtest.Run(t, sb, "plan", "--config", cfg, "--out", out); code != 0 || !strings.Contains(stdout, "Isolated: the registry refuses it "+other) {
		t.Fatalf("plan with the credential refused %s: exit %d, want 0 and the isolation shown\n%s\n%s", other, code, stdout, stderr)
	}

	if _, err := os.Stat(out); err != nil {
		t.Fatalf("no plan saved for an isolated credential: %v", err)
	}
}
