package keyring

import (
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// TestMain is sandboxtest's: each test here starts a sandbox of its own (sandboxtest.Start), and
// none is shared, but the package's ghcrsync binary (sandboxtest.Binary) is removed at its end.
func TestMain(m *testing.M) { sandboxtest.Main(m, sandbox.Options{}) }
