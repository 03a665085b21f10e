package plan

import (
	"fmt"

	"github.com/ghcrsync/ghcrsync/internal/human"
)

// configDrift names every node ghcrsync rotated to this very revision (its verified marker
// says so) whose active machine config no longer carries the credential: whatever owns the
// machine config (talosctl, talhelper, Omni, the Terraform Talos provider) re-applied it
// without the RegistryAuthConfig document since. The plan rotates such a node again; the
// warning says where the fix belongs, or the next re-apply reverts it once more.
func configDrift(s Snapshot, in Input) (names, warnings []string) {
	for _, n := range s.Nodes {
		t := n.Talos
		if t == nil || in.AuthDigest == "" || n.VerifiedRevision != in.CredentialRevision || t.ConfiguredDigest == in.AuthDigest {
			continue
		}

		holds := "no credential for " + in.Registry
		if t.ConfiguredDigest != "" {
			holds = "another credential (" + human.Short(t.ConfiguredDigest) + ")"
		}

		when := ""
		if !t.ConfigUpdated.IsZero() {
			when = " at " + human.Clock(t.ConfigUpdated)
		}

		names = append(names, n.Name)
		warnings = append(warnings, fmt.Sprintf("%s's machine config drifted: ghcrsync rotated it to revision %s and proved it, but its active config now carries %s: "+
			"it was re-applied%s by something other than ghcrsync (talosctl apply-config, talhelper, Omni, the Terraform Talos provider); "+
			"add the RegistryAuthConfig document to that source, or its next apply reverts the credential again (this plan rotates the node again)",
			n.Name, human.Short(in.CredentialRevision), holds, when))
	}

	return names, warnings
}
