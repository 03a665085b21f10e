package apply_test

import (
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// plan asks the registry about every credential the fleet and the managed secrets hold: with the
// one a node holds revoked (a leak, revoked first), the plan is an emergency rotation naming the
// node; the new credential is valid. The negative control: nothing revoked, no emergency, every
// credential in use valid.
func TestPlanKnowsTheCredentialsInUse(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-2"

	m, ok := sb.Fleet().Machine(name)
	if !ok {
		t.Fatal("no machine " + name)
	}

	held := m.Effective()

	for _, revoked := range []bool{false, true} {
		r := newRotation(t, sb, nil, name)

		if revoked {
			sb.Registry().RevokeCredential(held.Username)
			t.Cleanup(func() { sb.Registry().AddCredential(held.Username, held.Password) })
		}

		r.plan()
		p := r.planned

		var onNode *plan.CredentialInUse

		for i, u := range p.CredentialsInUse {
			if u.Desired && u.State != plan.CredentialValid {
				t.Fatalf("the new credential: %+v", u)
			}

			for _, n := range u.Nodes {
				if n == name {
					onNode = &p.CredentialsInUse[i]
				}
			}
		}

		switch {
		case onNode == nil:
			t.Fatalf("revoked %t: no credential in use on %s: %+v", revoked, name, p.CredentialsInUse)
		case !revoked && (p.Emergency() || onNode.State != plan.CredentialValid):
			t.Fatalf("nothing revoked: emergency %t, %+v", p.Emergency(), *onNode)
		case revoked && (!p.Emergency() || onNode.State != plan.CredentialRefused || !strings.Contains(onNode.Sentence(), "refused by the registry")):
			t.Fatalf("the node's credential revoked: emergency %t, %+v", p.Emergency(), *onNode)
		}
	}
}

// In an emergency rotation the consumer pull secrets are written before any node is claimed:
// pods using them can pull again at once. The negative control: in an ordinary rotation the
// consumers still hold the old credential when the first node is claimed (they follow the
// nodes).
func TestEmergencyWritesConsumersBeforeAnyNode(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-2"

	m, ok := sb.Fleet().Machine(name)
	if !ok {
		t.Fatal("no machine " + name)
	}

	consumer := sandbox.ConsumerNamespaces[0]

	for _, emergency := range []bool{false, true} {
		held := m.Effective() // what the node's runtime uses now (the last rotation's)
		r := newRotation(t, sb, nil, name)

		if emergency {
			sb.Registry().RevokeCredential(held.Username)
			t.Cleanup(func() { sb.Registry().AddCredential(held.Username, held.Password) })
		}

		path := r.plan()
		if r.planned.Emergency() != emergency {
			t.Fatalf("plan emergency %t, want %t", r.planned.Emergency(), emergency)
		}

		var atClaim string

		res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
			if phase == state.PhaseClaimed && atClaim == "" {
				atClaim = secretDigest(t, sb, consumer, sandbox.ConsumerSecret)
			}
		}})
		if err != nil {
			t.Fatal(err)
		}

		if x := r.result(res, name); x.Outcome != state.OutcomeDone {
			t.Fatalf("emergency %t: %+v", emergency, x)
		}

		if written := atClaim == wantDigest(r.cred); written != emergency {
			t.Fatalf("emergency %t: the consumer held the new credential at the first claim: %t", emergency, written)
		}

		if emergency {
			sb.Registry().AddCredential(held.Username, held.Password)
		}
	}
}
