package containerd_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/containerd"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
)

// A real containerd pulls a private image from the sandbox registry through its CRI image
// service, as the kubelet asks it, with the credential its config holds (rendered as Talos
// renders a machine's registry auth) or a pull secret's:
//   - the node's credential, valid: pulled, and the registry's access log names that user for
//     the token and the manifest (containerd's own requests, its POST password grant first);
//   - the node's credential revoked in the registry: refused, the image not there;
//   - no credential at all: refused (an anonymous token reads no private package);
//   - a pull secret's credential on a node that holds none: pulled;
//   - a reboot that loads the new credential: pulled again (the control of the revoked case).
func TestRealContainerdPullsWithTheNodesCredential(t *testing.T) {
	if err := containerd.Available(); err != nil {
		// make test requires it where it installed it (GHCRSYNC_REAL_RUNTIME=required).
		if os.Getenv("GHCRSYNC_REAL_RUNTIME") == "required" {
			t.Fatal(err)
		}

		t.Skipf("SKIPPED, no real container runtime on this machine: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	reg, err := registry.Start()
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { reg.Close(context.Background()) })
	reg.AddCredential("fleet-old", "old-secret")
	reg.AddCredential("fleet-new", "new-secret")

	// ghcr.io mirrored to the sandbox registry, as a real node's machine config says.
	mirrored := containerd.Mirrored(reg.URL(), registry.RegistryHost)
	withAuth := func(user, password string) containerd.Registries {
		return mirrored.WithAuth(registry.RegistryHost, &containerd.Auth{Username: user, Password: password})
	}

	node, err := containerd.Start(ctx, containerd.Spec{Dir: t.TempDir()}, withAuth("fleet-old", "old-secret"))
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { node.Teardown(context.Background()) })

	const image = "ghcr.io/" + registry.PrivateOrg + "/private-probe:v1"

	pulled := func(t *testing.T, pullSecret *containerd.Auth) {
		t.Helper()

		_ = node.Remove(ctx, image)

		if _, err := node.Pull(ctx, image, pullSecret); err != nil {
			log, _ := os.ReadFile(node.LogPath())
			t.Fatalf("pull: %v\n%s", err, log)
		}

		if ok, err := node.Has(ctx, image); !ok || err != nil {
			t.Fatalf("the image is not on the node after its pull (%v)", err)
		}
	}
	refused := func(t *testing.T, pullSecret *containerd.Auth) {
		t.Helper()

		_ = node.Remove(ctx, image)

		_, err := node.Pull(ctx, image, pullSecret)
		if err == nil || !strings.Contains(err.Error(), "ghcrsync/private-probe") {
			t.Fatalf("pull was not refused: %v", err)
		}

		if ok, _ := node.Has(ctx, image); ok {
			t.Fatal("a refused pull left the image on the node")
		}
	}
	usersAnswered := func(what string) map[string]bool {
		users := map[string]bool{}

		for _, a := range reg.AccessLog() {
			if a.What == what && a.Status == 200 {
				users[a.User] = true
			}
		}

		return users
	}

	t.Run("node_credential", func(t *testing.T) {
		pulled(t, nil)

		var post bool
		for _, a := range reg.AccessLog() {
			post = post || (a.What == "token" && a.Method == "POST" && a.User == "fleet-old" && a.Status == 200)
		}

		if !post || !usersAnswered("manifest")["fleet-old"] || !strings.Contains(strings.ToLower(reg.AccessLog()[0].UserAgent), "containerd") {
			t.Fatalf("the registry did not see containerd pull as fleet-old with a password grant: %+v", reg.AccessLog())
		}
	})

	t.Run("revoked", func(t *testing.T) {
		reg.RevokeCredential("fleet-old")
		refused(t, nil)
	})

	t.Run("pull_secret", func(t *testing.T) {
		pulled(t, &containerd.Auth{Username: "fleet-new", Password: "new-secret"})
	})

	t.Run("reboot_loads_the_new_credential", func(t *testing.T) {
		if err := node.Reboot(ctx, withAuth("fleet-new", "new-secret")); err != nil {
			t.Fatal(err)
		}

		pulled(t, nil)
	})

	t.Run("no_credential", func(t *testing.T) {
		if err := node.Reboot(ctx, mirrored); err != nil {
			t.Fatal(err)
		}

		refused(t, nil)
	})

	t.Run("live_reload_restarts_on_a_change_only", func(t *testing.T) {
		// Talos 1.14: the same registry config leaves containerd running; a new credential
		// restarts it on the new config.
		if restarted, err := node.Reload(ctx, mirrored); restarted || err != nil {
			t.Fatalf("an unchanged config restarted containerd (%v, %v)", restarted, err)
		}

		if restarted, err := node.Reload(ctx, withAuth("fleet-new", "new-secret")); !restarted || err != nil {
			t.Fatalf("a new credential did not restart containerd (%v, %v)", restarted, err)
		}

		pulled(t, nil)
	})

	// The passwords went to containerd's config file only: not in its log.
	if log, _ := os.ReadFile(node.LogPath()); strings.Contains(string(log), "old-secret") || strings.Contains(string(log), "new-secret") {
		t.Fatal("containerd's log holds a password")
	}
}
