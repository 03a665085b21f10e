package plan

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/state"
)

// The verdict's rules, one named case each: what makes a use new, old or unknown.
func TestInventory(t *testing.T) {
	in := Input{CredentialRevision: "rev-new-0123456789", AuthDigest: "auth-new-0123456789", PullSecretRevision: "ps-new-0123456789"}
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	proved := func(name string) Node {
		return Node{Name: name, UID: "u-" + name, Ready: true, BootID: "b1", VerifiedRevision: in.CredentialRevision, VerifiedBoot: "b1",
			Talos: &TalosFacts{Version: "v1.13.9", ConfiguredDigest: in.AuthDigest}}
	}
	secret := func(name, digest, foreign string) SecretObs {
		return SecretObs{Namespace: "team", Name: name, Role: RoleConsumer, Exists: true, Type: "kubernetes.io/dockerconfigjson", Digest: digest, Foreign: foreign}
	}

	for _, tc := range []struct {
		name  string
		snap  Snapshot
		safe  bool
		state UseState // of the case's first use after sorting ("" = not checked)
		why   string
	}{
		{"all_new", Snapshot{Nodes: []Node{proved("w1")}, Secrets: []SecretObs{secret("ghcr-pull", in.PullSecretRevision, "")}}, true, UseNew, "verified by ghcrsync"},
		{"empty_fleet_proves_nothing", Snapshot{}, false, UseUnknown, "no Node matches"},
		{"config_carries_another", Snapshot{Nodes: []Node{{Name: "w1", Ready: true, Talos: &TalosFacts{Version: "v1.13.9", ConfiguredDigest: "auth-old"}}}}, false, UseOld, "another credential"},
		{"runtime_unproven", Snapshot{Nodes: []Node{{Name: "w1", Ready: true, Talos: &TalosFacts{Version: "v1.13.9", ConfiguredDigest: in.AuthDigest,
			ConfigUpdated: at, CRIStarted: at.Add(-time.Hour)}}}}, false, UseOld, "nothing proves"},
		{"runtime_started_after_the_config", Snapshot{Nodes: []Node{{Name: "w1", Ready: true, Talos: &TalosFacts{Version: "v1.13.9", ConfiguredDigest: in.AuthDigest,
			ConfigUpdated: at, CRIStarted: at.Add(time.Hour)}}}}, true, UseNew, "started at"},
		{"marker_of_another_boot_is_no_proof", Snapshot{Nodes: []Node{func() Node { n := proved("w1"); n.BootID = "b2"; return n }()}}, false, UseOld, "nothing proves"},
		{"talos_unreadable", Snapshot{Nodes: []Node{{Name: "w1", TalosError: "connection refused"}}}, false, UseUnknown, "connection refused"},
		{"excluded_node_says_what_to_do", Snapshot{Nodes: []Node{{Name: "w9", Ready: true, Talos: &TalosFacts{Version: "v1.13.9", ConfiguredDigest: "auth-old"}}}}, false, UseOld, "nodes.exclude"},
		{"foreign_consumer_on_the_old", Snapshot{Nodes: []Node{proved("w1")}, Secrets: []SecretObs{secret("ghcr-pull", "ps-old", "External Secrets (x=y)")}}, false, UseOld, "managed by External Secrets"},
		{"foreign_consumer_already_new", Snapshot{Nodes: []Node{proved("w1")}, Secrets: []SecretObs{secret("ghcr-pull", in.PullSecretRevision, "External Secrets (x=y)")}}, true, UseNew, ""},
		{"missing_consumer_uses_nothing", Snapshot{Nodes: []Node{proved("w1")}, Secrets: []SecretObs{{Namespace: "team", Name: "ghcr-pull", Role: RoleConsumer}}}, true, UseNew, ""},
		{"missing_root_cannot_pull", Snapshot{Nodes: []Node{proved("w1")}, Secrets: []SecretObs{{Namespace: "flux-system", Name: "ghcr-auth", Role: RoleRoot}}}, false, UseOld, "Flux cannot pull"},
		{"missing_namespace_is_not_a_use", Snapshot{Nodes: []Node{proved("w1")}, Secrets: []SecretObs{{Namespace: "gone", Name: "ghcr-pull", Role: RoleConsumer, NamespaceMissing: true}}}, true, UseNew, ""},
		{"secret_of_another_type", Snapshot{Nodes: []Node{proved("w1")}, Secrets: []SecretObs{{Namespace: "team", Name: "ghcr-pull", Role: RoleConsumer, Exists: true, Type: "Opaque"}}}, false, UseUnknown, "type Opaque"},
		{"template_on_the_old", Snapshot{Nodes: []Node{proved("w1")}, Templates: []TemplateObs{{Namespace: "kube-system", Secret: "t", Key: "k", Digest: "auth-old"}}}, false, UseOld, "join with another"},
		{"record_naming_no_machine", Snapshot{Nodes: []Node{func() Node { n := proved("w1"); n.InternalIPs = []string{"10.0.0.1", "10.0.0.2"}; return n }()}},
			false, UseUnknown, "several InternalIPs of one family"},
		{"address_shared_with_another_node", Snapshot{Nodes: []Node{
			func() Node { n := proved("w1"); n.InternalIPs = []string{"10.0.0.1"}; return n }(),
			func() Node { n := proved("w2"); n.InternalIPs = []string{"10.0.0.1"}; return n }(),
		}}, false, UseUnknown, "also reported by w2"},
		{"dual_stack_is_one_machine", Snapshot{Nodes: []Node{func() Node { n := proved("w1"); n.InternalIPs = []string{"10.0.0.1", "fd00::1"}; return n }()}},
			true, UseNew, "verified by ghcrsync"},
		{"template_without_credential", Snapshot{Nodes: []Node{proved("w1")}, Templates: []TemplateObs{{Namespace: "kube-system", Secret: "t", Key: "k"}}}, false, UseOld, "carries no credential"},
		// The rotation began at `at`: a writer of the old credential since then put it back.
		{"put_back_during_the_rotation", Snapshot{Nodes: []Node{proved("w1")}, Secrets: []SecretObs{func() SecretObs {
			s := secret("ghcr-pull", "ps-old", "")
			s.Writers = []Writer{{Manager: "kubectl", At: at.Add(-time.Hour)}, {Manager: "ksail", Operation: "Update", At: at.Add(time.Minute)}}
			return s
		}()}}, false, UseOld, "ksail wrote it at 2026-12-01 10:01:00Z, after this rotation began"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := in
			in.Exclude = []string{"w9"}
			in.Rotation = &state.Rotation{Started: at.Add(300 * time.Millisecond)} // managedFields times are whole seconds

			for i, n := range tc.snap.Nodes { // a valid record unless the case says otherwise
				if n.UID == "" {
					tc.snap.Nodes[i].UID = "u-" + n.Name
				}

				if n.InternalIPs == nil {
					tc.snap.Nodes[i].InternalIPs = []string{"10.0.0." + strconv.Itoa(i+1)}
				}
			}

			v := Inventory(tc.snap, in)
			if v.SafeToRevoke != tc.safe {
				t.Fatalf("safe to revoke %t, want %t: %s (%+v)", v.SafeToRevoke, tc.safe, v.Sentence(), v.Uses)
			}

			if len(v.Uses) == 0 || v.Uses[0].State != tc.state || !strings.Contains(v.Uses[0].Why+" "+v.Uses[0].Next, tc.why) {
				t.Fatalf("first use %+v, want %s with %q", v.Uses, tc.state, tc.why)
			}

			if want := map[bool]string{true: "It is safe to revoke.", false: "Do not revoke the old credential yet"}[tc.safe]; !strings.Contains(v.Sentence(), want) {
				t.Fatalf("sentence %q lacks %q", v.Sentence(), want)
			}
		})
	}
}

// Only a writer since the rotation began is named as putting the old credential back: one
// before it (the credential's owner until ghcrsync took it over), no rotation in progress, or a
// finished one, names nobody.
func TestPutBackNamesOnlyAWriterSinceTheRotationBegan(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	writers := []Writer{{Manager: "kubectl", At: at.Add(-time.Second)}, {Manager: "ksail", At: at}, {Manager: "flux", At: at.Add(time.Minute)}}
	finished := at.Add(time.Hour)

	for _, tc := range []struct {
		name     string
		writers  []Writer
		rotation *state.Rotation
		want     string
	}{
		{"the last writer since the start", writers, &state.Rotation{Started: at.Add(300 * time.Millisecond)}, "flux"},
		{"the same second as the start counts", writers[:2], &state.Rotation{Started: at.Add(300 * time.Millisecond)}, "ksail"},
		{"before the start", writers[:1], &state.Rotation{Started: at}, ""},
		{"no rotation in progress", writers, nil, ""},
		{"a finished rotation", writers, &state.Rotation{Started: at, Finished: &finished}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, ok := putBack(tc.writers, Input{Rotation: tc.rotation}.rotationStarted())
			if w.Manager != tc.want || ok != (tc.want != "") {
				t.Fatalf("putBack = %q, %t; want %q", w.Manager, ok, tc.want)
			}
		})
	}
}

// Except drops a kind (the root before it is written); Still lists old and unknown uses only.
func TestRevocationExcept(t *testing.T) {
	v := Revocation{}
	v.add(Use{Kind: UseRoot, Name: "flux-system/ghcr-auth", State: UseOld})
	v.add(Use{Kind: UseNode, Name: "w1", State: UseNew})

	if !v.Except(UseRoot).SafeToRevoke || len(v.Still()) != 1 || v.Except(UseNode).SafeToRevoke {
		t.Fatalf("Except/Still: %+v", v)
	}
}

// A root Flux could not pull with the new credential keeps a clean verdict from saying safe to
// revoke, and names the source and why; the verdict it came from is left as it was.
func TestRootNotProved(t *testing.T) {
	v := Revocation{SafeToRevoke: true}
	v.add(Use{Kind: UseNode, Name: "w1", State: UseNew})

	got := v.RootNotProved("flux-system/flux-system", "OCIArtifactPullFailed: UNAUTHORIZED")

	if got.Clean() || !v.Clean() || len(v.Uses) != 1 {
		t.Fatalf("RootNotProved: %+v (from %+v)", got, v)
	}

	if s := got.StillUsedBy(); !strings.Contains(s, "Flux's root source flux-system/flux-system") {
		t.Errorf("StillUsedBy says %q", s)
	}

	if u := got.Uses[0]; u.Kind != UseFluxSource || !strings.Contains(u.Why, "UNAUTHORIZED") || u.Next == "" {
		t.Errorf("the first use is %+v, want Flux's root source with why and what to do", u)
	}
}

// A Node record names one machine when it has a uid and one InternalIP per family that no other
// Node reports.
func TestIdentityProblems(t *testing.T) {
	node := func(name, uid string, ips ...string) Node { return Node{Name: name, UID: uid, InternalIPs: ips} }

	for _, tc := range []struct {
		name   string
		nodes  []Node
		others []Identity
		want   map[string]string // node → a phrase of its problem; absent: none
	}{
		{"valid", []Node{node("a", "ua", "10.0.0.1"), node("b", "ub", "10.0.0.2")}, nil, nil},
		{"dual_stack", []Node{node("a", "ua", "10.0.0.1", "fd00::1")}, nil, nil},
		{"no_uid", []Node{node("a", "", "10.0.0.1")}, nil, map[string]string{"a": "no uid"}},
		{"no_internal_ip", []Node{node("a", "ua")}, nil, map[string]string{"a": "no InternalIP"}},
		{"two_ipv4", []Node{node("a", "ua", "10.0.0.1", "10.0.0.9")}, nil, map[string]string{"a": "several InternalIPs of one family (10.0.0.1, 10.0.0.9)"}},
		{"the_same_twice", []Node{node("a", "ua", "10.0.0.1", "10.0.0.1")}, nil, map[string]string{"a": "several InternalIPs"}},
		{"not_an_address", []Node{node("a", "ua", "node-a.example")}, nil, map[string]string{"a": `"node-a.example", which is not an IP address`}},
		{"hostile_value_bounded", []Node{node("a", "ua", strings.Repeat("x", 500))}, nil, map[string]string{"a": "…"}},
		{"duplicate_uid", []Node{node("a", "u", "10.0.0.1"), node("b", "u", "10.0.0.2")}, nil,
			map[string]string{"a": "uid u is also reported by b", "b": "uid u is also reported by a"}},
		{"duplicate_ip", []Node{node("a", "ua", "10.0.0.1"), node("b", "ub", "10.0.0.1"), node("c", "uc", "10.0.0.3")}, nil,
			map[string]string{"a": "InternalIP 10.0.0.1 is also reported by b", "b": "also reported by a"}},
		{"address_of_a_node_outside_the_selector", []Node{node("a", "ua", "10.0.0.1")}, []Identity{{Name: "control-1", UID: "uc", InternalIPs: []string{"10.0.0.1"}}},
			map[string]string{"a": "InternalIP 10.0.0.1 is also reported by control-1"}},
		{"duplicate_secondary_ip", []Node{node("a", "ua", "10.0.0.1", "fd00::1"), node("b", "ub", "10.0.0.2", "fd00::1")}, nil,
			map[string]string{"a": "InternalIP fd00::1 is also reported by b", "b": "fd00::1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := IdentityProblems(Snapshot{Nodes: tc.nodes, OtherNodes: tc.others})
			if len(got) != len(tc.want) {
				t.Fatalf("problems %v, want %d", got, len(tc.want))
			}

			for name, phrase := range tc.want {
				if !strings.Contains(got[name], phrase) {
					t.Errorf("%s: %q lacks %q", name, got[name], phrase)
				}
			}
		})
	}
}
