// Package object is the pure vocabulary of the Kubernetes objects ghcrsync acts on, without a
// client: the marks it writes on Nodes (annotations, the claim and release patches, the recovery
// record), the steering taint's patches, a Node as the plan reads it, and the references its
// Events name. Its writes go through a port (Patcher), never an API client of its own.
package object

// Annotations ghcrsync writes on Nodes (and reads back).
const (
	// OwnerAnnotation names the run (its holder id) that holds the node's fence.
	OwnerAnnotation = "ghcrsync.dev/owner"
	// PhaseAnnotation mirrors the fence's phase (state.Phase), written after each mutation.
	PhaseAnnotation = "ghcrsync.dev/phase"
	// RecordAnnotation is the recovery record (state.Fence as JSON): enough to undo the fence
	// without the state file.
	RecordAnnotation = "ghcrsync.dev/record"
	// VerifiedRevisionAnnotation and VerifiedBootAnnotation mark a node whose runtime was proved
	// to pull with a credential revision, on a boot.
	VerifiedRevisionAnnotation = "ghcrsync.dev/verified-revision"
	VerifiedBootAnnotation     = "ghcrsync.dev/verified-boot-id"
	// KeyringAnnotation is the credential (its auth digest) ghcrsync last wrote into the node's
	// kubelet keyring, or found there; absent when ghcrsync knows of none.
	KeyringAnnotation = "ghcrsync.dev/keyring"
	// ScaleDownGuardByAnnotation records that ghcrsync set the scale-down guard (and so must
	// remove it); it is absent when the guard was already there.
	ScaleDownGuardByAnnotation = "ghcrsync.dev/scale-down-disabled-by"
	// ScaleDownDisabledAnnotation tells the cluster autoscaler to leave a node alone.
	ScaleDownDisabledAnnotation = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
	// UnprovenAnnotation marks a node's cordon as ghcrsync's unproven hold: a fence was undone
	// after its Talos config was written and before its runtime was proved to pull with it (the
	// run failed, was killed, or stopped). The value is the revision written. The next apply
	// proves it and lifts the hold; `release --uncordon-unproven` lifts it without a proof.
	UnprovenAnnotation = "ghcrsync.dev/unproven"
)

// ControlPlaneLabel marks control-plane Nodes.
const ControlPlaneLabel = "node-role.kubernetes.io/control-plane"

// NodeGroupLabel names the autoscaler node group a Node belongs to (the Hetzner cloud
// provider's label): its rotation's estimate is of the autoscaled class.
const NodeGroupLabel = "hcloud/node-group"

// SteeredByAnnotation names the run (its holder id) whose steering taint the node carries: the
// taint's value is only a digest of it (a taint value cannot hold a holder id).
const SteeredByAnnotation = "ghcrsync.dev/steered-by"

// SuspendedByAnnotation names the run that suspended a Kustomization: only that run (or a
// release of it) resumes it; one suspended by a person carries none and is never resumed.
const SuspendedByAnnotation = "ghcrsync.dev/suspended-by"

// The marks on every pull secret ghcrsync writes: the configuration that wrote it (its Lease,
// namespace/name) and the credential it holds (the credential block's name).
const (
	ConfigurationAnnotation = "ghcrsync.dev/configuration"
	CredentialAnnotation    = "ghcrsync.dev/credential"
)
