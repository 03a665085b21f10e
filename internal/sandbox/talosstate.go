package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/registry"
	machinetype "github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/cluster"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/cri"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// talosNamespaces are the COSI namespaces the simulated node serves, registered with their
// descriptions as machined registers them (meta.Namespace resources), so a client resolves them.
var talosNamespaces = []struct {
	ns   resource.Namespace
	desc string
}{
	{cluster.NamespaceName, "Cluster configuration and discovery resources."},
	{talosconfig.NamespaceName, "Talos node configuration."},
	{cri.NamespaceName, "CRI Seccomp resources."},
	{k8s.NamespaceName, "Kubernetes all node types resources."},
	{k8s.ControlPlaneNamespaceName, "Kubernetes control plane resources."},
	{runtime.NamespaceName, "Talos runtime (also block devices and volumes)."}, // block.NamespaceName is the same
}

// talosResourceTypes are the resource types the simulated node serves: their ResourceDefinitions
// (names, aliases, sensitivity, default namespace) come from the machinery packages, as in Talos.
func talosResourceTypes() []meta.ResourceWithRD {
	return []meta.ResourceWithRD{
		&talosconfig.MachineConfig{}, talosconfig.NewMachineType(),
		runtime.NewMachineStatus(), runtime.NewVersion(), runtime.NewDiagnostic(runtime.NamespaceName, ""),
		k8s.NewNodename(k8s.NamespaceName, ""), k8s.NewStaticPodStatus(k8s.NamespaceName, ""), k8s.NewBootstrapManifestsConfig(),
		cluster.NewMember(cluster.NamespaceName, ""), block.NewVolumeStatus(block.NamespaceName, ""), cri.NewRegistriesConfig(),
	}
}

// registerDefinitions creates the meta namespace's Namespace and ResourceDefinition resources.
func registerDefinitions(ctx context.Context, st state.State) error {
	ns := registry.NewNamespaceRegistry(st)
	if err := ns.RegisterDefault(ctx); err != nil {
		return err
	}

	for _, n := range talosNamespaces {
		if err := ns.Register(ctx, n.ns, n.desc); err != nil {
			return err
		}
	}

	rd := registry.NewResourceRegistry(st)
	if err := rd.RegisterDefault(ctx); err != nil {
		return err
	}

	for _, r := range talosResourceTypes() {
		if err := rd.Register(ctx, r); err != nil {
			return fmt.Errorf("register %s: %w", r.ResourceDefinition().Type, err)
		}
	}

	return nil
}

// accessPolicy is Talos's rule for resources read through the API: read-only; a type must have
// a ResourceDefinition, its namespace must be registered, and a sensitive type needs os:admin.
func accessPolicy(st state.State) state.FilteringRule {
	return func(ctx context.Context, access state.Access) error {
		if !access.Verb.Readonly() {
			return status.Error(codes.PermissionDenied, "write access is not allowed")
		}

		id := strings.ToLower(access.ResourceType)

		rd, err := safe.StateGet[*meta.ResourceDefinition](ctx, st, resource.NewMetadata(meta.NamespaceName, meta.ResourceDefinitionType, id, resource.VersionUndefined))
		if state.IsNotFoundError(err) {
			return status.Errorf(codes.PermissionDenied, "resource type %q is not supported", access.ResourceType)
		} else if err != nil {
			return err
		}

		if rd.TypedSpec().Sensitivity == meta.Sensitive && !hasRole(ctx, roleAdmin) {
			return status.Error(codes.PermissionDenied, "not authorized")
		}

		_, err = safe.StateGet[*meta.Namespace](ctx, st, resource.NewMetadata(meta.NamespaceName, meta.NamespaceType, access.ResourceNamespace, resource.VersionUndefined))
		if state.IsNotFoundError(err) {
			return status.Errorf(codes.PermissionDenied, "namespace %q is not supported", access.ResourceNamespace)
		}

		return err
	}
}

// initResources fills the machine's COSI state with the resources Talos keeps about itself.
func (m *Machine) initResources(ctx context.Context) error {
	if err := registerDefinitions(ctx, m.cosi); err != nil {
		return err
	}

	mt := talosconfig.NewMachineType()
	mt.SetMachineType(m.machineType())

	ver := runtime.NewVersion()
	ver.TypedSpec().Version = m.TalosTag

	name := k8s.NewNodename(k8s.NamespaceName, k8s.NodenameID)
	name.TypedSpec().Nodename = m.Name
	name.TypedSpec().HostnameVersion = "1"

	ephemeral := block.NewVolumeStatus(block.NamespaceName, "EPHEMERAL")
	ephemeral.TypedSpec().Phase = block.VolumePhaseReady
	ephemeral.TypedSpec().Type = block.VolumeTypePartition
	ephemeral.TypedSpec().Location = "/dev/sda6"
	ephemeral.TypedSpec().MountLocation = "/var"
	ephemeral.TypedSpec().Filesystem = block.FilesystemTypeXFS
	ephemeral.TypedSpec().SetSize(94 << 30)

	all := []resource.Resource{mt, ver, name, ephemeral, runtime.NewMachineStatus()}

	if m.Role == RoleControlPlane {
		manifests := k8s.NewBootstrapManifestsConfig()
		manifests.TypedSpec().ClusterDomain, manifests.TypedSpec().PodCIDRs = "cluster.local", []string{"10.244.0.0/16"}
		manifests.TypedSpec().FlannelEnabled = true
		all = append(all, manifests)
	}

	for _, r := range all {
		if err := m.cosi.Create(ctx, r); err != nil {
			return err
		}
	}

	return m.syncRegistries(ctx)
}

func (m *Machine) machineType() machinetype.Type {
	if m.Role == RoleControlPlane {
		return machinetype.TypeControlPlane
	}

	return machinetype.TypeWorker
}

// put creates or replaces a resource.
func put(ctx context.Context, st state.State, r resource.Resource) error {
	cur, err := st.Get(ctx, r.Metadata())

	switch {
	case state.IsNotFoundError(err):
		return st.Create(ctx, r)
	case err != nil:
		return err
	}

	r.Metadata().SetVersion(cur.Metadata().Version())

	return st.Update(ctx, r)
}

// syncRegistries renders the active config's registry settings into RegistryConfigs.cri (as the
// CRI registries controller does).
func (m *Machine) syncRegistries(ctx context.Context) error {
	mc, err := m.config(ctx, talosconfig.ActiveID)
	if err != nil {
		return err
	}

	rc := cri.NewRegistriesConfig()
	rc.TypedSpec().RegistryAuths = map[string]*cri.RegistryAuthConfig{}

	for host, a := range mc.Config().RegistryAuthConfigs() {
		rc.TypedSpec().RegistryAuths[host] = &cri.RegistryAuthConfig{
			RegistryUsername: a.Username(), RegistryPassword: a.Password(), RegistryAuth: a.Auth(), RegistryIdentityToken: a.IdentityToken(),
		}
	}

	return put(ctx, m.cosi, rc)
}

// SetStage puts the machine in stage as someone else's maintenance would (talosctl upgrade:
// "upgrading"), its Node untouched; SetStage(runtime.MachineStageRunning) ends it.
func (m *Machine) SetStage(stage runtime.MachineStage) {
	m.setStage(context.Background(), stage, stage == runtime.MachineStageRunning)
}

// setStage records the machine's stage (MachineStatuses.runtime) and emits its event.
func (m *Machine) setStage(ctx context.Context, stage runtime.MachineStage, ready bool) {
	ms := runtime.NewMachineStatus()
	ms.TypedSpec().Stage, ms.TypedSpec().Status.Ready = stage, ready

	if !ready && stage == runtime.MachineStageRunning {
		ms.TypedSpec().Status.UnmetConditions = []runtime.UnmetCondition{{Name: "nodeReady", Reason: "node is not ready"}}
	}

	if err := put(ctx, m.cosi, ms); err != nil && !errors.Is(err, context.Canceled) {
		m.fleet.log.Warn("machine status", "node", m.Name, "error", err)
	}

	m.events.machineStatus(stage, ready)
}

// syncStaticPods records the control-plane static pods as running (StaticPodStatuses.k8s).
func (m *Machine) syncStaticPods(ctx context.Context) error {
	if m.Role != RoleControlPlane {
		return nil
	}

	for _, c := range controlPlaneComponents {
		sp := k8s.NewStaticPodStatus(k8s.NamespaceName, "kube-system/"+c+"-"+m.Name)
		sp.TypedSpec().PodStatus = map[string]any{
			"phase":      "Running",
			"conditions": []any{map[string]any{"type": "Ready", "status": "True"}},
		}

		if err := put(ctx, m.cosi, sp); err != nil {
			return err
		}
	}

	return nil
}

// syncMembers records every machine of the fleet as a discovered member (Members.cluster).
func (m *Machine) syncMembers(ctx context.Context) error {
	for _, other := range m.fleet.Machines() {
		mem := cluster.NewMember(cluster.NamespaceName, other.Name)
		mem.TypedSpec().NodeID = other.Name
		mem.TypedSpec().Hostname = other.Name
		mem.TypedSpec().MachineType = other.machineType()
		mem.TypedSpec().OperatingSystem = "Talos (" + other.TalosTag + ")"

		if addr, err := netip.ParseAddr(other.IP); err == nil {
			mem.TypedSpec().Addresses = []netip.Addr{addr}
		}

		if err := put(ctx, m.cosi, mem); err != nil {
			return err
		}
	}

	return nil
}

// controlPlaneComponents are the static pods a control plane's kubelet runs.
var controlPlaneComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}
