package verdict

import (
	"context"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/plan"
)

// A node that joins mid-run is planned on the fleet as plan reads it, the registry's judgement
// included (apply's ReadJudged, the real fleet reader and registry): with the credential the
// fleet holds revoked, the plan made from that read is an emergency, as plan's own was — it
// steers hard (NoSchedule), and no evicted pod is let onto a node that cannot pull. The negative
// control is what late nodes were planned on before: the plain read judges no credential, and
// its plan forgets the emergency (soft steering). apply's run case late_node_in_an_emergency
// plays the whole run.
func TestLateNodesArePlannedWithTheRegistrysJudgement(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	t.Setenv("SOPS_AGE_KEY_FILE", sb.Path(sandbox.AgeKeyFile))

	// The fleet holds the credential it booted with, or the one configured (an earlier rotation);
	// a new one is configured, and both are revoked: an emergency.
	held := []sandbox.Credential{sb.OldCredential(), sb.NewCredential()}
	if _, err := sb.RotateSecret("late-judged"); err != nil {
		t.Fatal(err)
	}

	for _, c := range held {
		sb.Registry().RevokeCredential(c.Username)
	}

	t.Cleanup(func() {
		for _, c := range held {
			sb.Registry().AddCredential(c.Username, c.Password)
		}
	})

	ws, err := workspace.Open(workspace.Options{ConfigPath: config(t, sb, nil), Context: ctx})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()

	in, err := ws.Apply()
	if err != nil {
		t.Fatal(err)
	}

	snap, input, err := in.Fleet.ReadJudged(ctx, false)
	if err != nil {
		t.Fatal(err)
	}

	judged := plan.Make(snap, input)
	if !judged.Emergency() || !judged.NodesRefused() || !judged.Steering.Hard() {
		t.Fatalf("the judged read: emergency %v, nodes refused %v, steering %s; credentials in use %+v",
			judged.Emergency(), judged.NodesRefused(), judged.Steering.Effect, snap.InUse)
	}

	refused := judged.Refused()
	if len(refused) == 0 || len(refused[0].Nodes) == 0 {
		t.Fatalf("the refused credential names no node: %+v", refused)
	}

	// The negative control: the plain read, as late nodes were planned before.
	snap, input, err = in.Fleet.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if plain := plan.Make(snap, input); plain.Emergency() || plain.Steering.Hard() {
		t.Fatalf("control: the plain read judged the credentials (%+v): the test no longer shows what it guards", snap.InUse)
	}
}
