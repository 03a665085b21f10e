package sandbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configdiff"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// metalInstalled is the validation mode of an installed bare-metal machine, as machined
// validates a config it is given.
type metalInstalled struct{}

func (metalInstalled) String() string        { return "metal" }
func (metalInstalled) RequiresInstall() bool { return false }
func (metalInstalled) InContainer() bool     { return false }

// defaultTryTimeout is how long a config applied in try mode stays before it is rolled back.
const defaultTryTimeout = time.Minute

// applyConfiguration implements MachineService.ApplyConfiguration as machined does: the config
// is parsed and validated (InvalidArgument on any error), the mode decided (a change that cannot
// be applied immediately needs a reboot; AUTO picks), a dry run answers with the summary and the
// config diff, and the change is then made: try (active only, rolled back after its timeout),
// no-reboot (persisted and active), staged (persisted) or reboot (persisted, then a reboot).
func (m *Machine) applyConfiguration(ctx context.Context, req *machine.ApplyConfigurationRequest) (*machine.ApplyConfiguration, error) {
	provider, cur, warnings, err := m.validateConfig(ctx, req.GetData())
	if err != nil {
		return nil, err
	}

	mode, details, err := m.applyMode(req.GetMode(), cur.Provider(), provider)
	if err != nil {
		return nil, err
	}

	if req.GetDryRun() {
		diff, err := configdiff.DiffConfigs(cur.Provider(), provider)
		if err != nil {
			return nil, fmt.Errorf("failed to generate diff: %w", err)
		}

		if diff == "" {
			diff = "No changes."
		}

		return &machine.ApplyConfiguration{Mode: mode, ModeDetails: fmt.Sprintf("Dry run summary:\n%s (skipped in dry-run).\nConfig diff:\n\n%s", strings.SplitN(details, ":", 2)[0], diff)}, nil
	}

	if mode != machine.ApplyConfigurationRequest_TRY {
		m.mu.Lock()
		m.cancelTry()
		m.mu.Unlock()
	}

	m.fleet.countTalosWrite(m.Name)
	m.fleet.witnessLease(ctx, m, "ApplyConfiguration ("+mode.String()+")")

	if mode == machine.ApplyConfigurationRequest_TRY {
		timeout := defaultTryTimeout
		if req.GetTryModeTimeout() != nil {
			timeout = req.GetTryModeTimeout().AsDuration()
		}

		details += fmt.Sprintf("\nThe config is applied in 'try' mode and will be automatically reverted back in %s", timeout)
		m.tryFor(timeout)
	}

	if err := m.commit(ctx, mode, req.GetData()); err != nil {
		return nil, err
	}

	return &machine.ApplyConfiguration{Mode: mode, Warnings: warnings, ModeDetails: details}, nil
}

// validateConfig loads and validates a config as machined does for an installed metal machine.
func (m *Machine) validateConfig(ctx context.Context, data []byte) (config.Provider, *talosconfig.MachineConfig, []string, error) {
	provider, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}

	if provider.RawV1Alpha1() == nil {
		return nil, nil, nil, status.Error(codes.InvalidArgument,
			"the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?")
	}

	// Talos before 1.12 has no RegistryAuthConfig document: its loader refuses the kind.
	if talosMinor(m.TalosTag) < 12 {
		for _, d := range provider.Documents() {
			if d.Kind() == "RegistryAuthConfig" {
				return nil, nil, nil, status.Error(codes.InvalidArgument, `error decoding document /RegistryAuthConfig: unknown document kind "RegistryAuthConfig"`)
			}
		}
	}

	warnings, err := provider.Validate(metalInstalled{})
	if err != nil {
		return nil, nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}

	more, err := provider.RuntimeValidate(ctx, m.cosi, metalInstalled{})
	if err != nil {
		return nil, nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}

	cur, err := m.config(ctx, talosconfig.ActiveID)
	if err != nil {
		return nil, nil, nil, status.Errorf(codes.Internal, "read active config: %v", err)
	}

	if got, want := provider.Machine().Type(), cur.Config().Machine().Type(); got != want {
		return nil, nil, nil, status.Errorf(codes.InvalidArgument, "machine type change is not supported: %s -> %s", want, got)
	}

	return provider, cur, append(warnings, more...), nil
}

// applyMode decides the mode and its details. Talos 1.14 removed the reboot mode (every change
// it accepts is live); before it, an immediate mode refuses a change that needs a reboot.
func (m *Machine) applyMode(mode machine.ApplyConfigurationRequest_Mode, cur, next config.Provider) (machine.ApplyConfigurationRequest_Mode, string, error) {
	immediate := m.canApplyImmediate(cur, next)

	switch mode {
	case machine.ApplyConfigurationRequest_TRY, machine.ApplyConfigurationRequest_NO_REBOOT:
		if immediate != nil {
			return mode, "", status.Error(codes.InvalidArgument, immediate.Error())
		}

		return mode, "Applied configuration without a reboot", nil
	case machine.ApplyConfigurationRequest_STAGED:
		return mode, "Staged configuration to be applied after the next reboot", nil
	case machine.ApplyConfigurationRequest_AUTO:
		if immediate != nil {
			return machine.ApplyConfigurationRequest_REBOOT, "Applied configuration with a reboot: " + immediate.Error(), nil
		}

		return machine.ApplyConfigurationRequest_NO_REBOOT, "Applied configuration without a reboot", nil
	case machine.ApplyConfigurationRequest_REBOOT:
		if m.liveRegistryAuth() {
			return mode, "", status.Error(codes.InvalidArgument, "reboot mode was removed in Talos 1.14: use auto or no-reboot")
		}

		return mode, "Applied configuration with a reboot", nil
	}

	return mode, "", fmt.Errorf("incorrect mode '%s' specified for the apply config call", mode)
}

// canApplyImmediate is Talos's rule (v1.13.9's machined): only some v1alpha1 sections may change
// without a reboot (the rest of v1alpha1 is compared after those are reset), and only the
// v1alpha1 document is compared. Any other document, a RegistryAuthConfig among them, changes in
// no-reboot, try and auto mode as "applied without a reboot" — and before Talos 1.14 the
// container runtime keeps the credential it booted with (reloadActive): applied, not loaded.
func (m *Machine) canApplyImmediate(cur, next config.Provider) error {
	a, b := cur.RawV1Alpha1(), next.RawV1Alpha1()
	if a == nil || b == nil {
		return errors.New("current or new config is not v1alpha1")
	}

	b = b.DeepCopy()
	b.ConfigDebug, b.ClusterConfig = a.ConfigDebug, a.ClusterConfig

	if mb, ma := b.MachineConfig, a.MachineConfig; mb != nil && ma != nil {
		mb.MachineCA, mb.MachineAcceptedCAs, mb.MachineTime, mb.MachineCertSANs = ma.MachineCA, ma.MachineAcceptedCAs, ma.MachineTime, ma.MachineCertSANs   //nolint:staticcheck
		mb.MachineInstall, mb.MachineNetwork, mb.MachineSysfs, mb.MachineSysctls = ma.MachineInstall, ma.MachineNetwork, ma.MachineSysfs, ma.MachineSysctls //nolint:staticcheck
		mb.MachineLogging, mb.MachineControlPlane, mb.MachineKubelet, mb.MachineKernel = ma.MachineLogging, ma.MachineControlPlane, ma.MachineKubelet, ma.MachineKernel
		mb.MachineRegistries, mb.MachinePods, mb.MachineSeccompProfiles = ma.MachineRegistries, ma.MachinePods, ma.MachineSeccompProfiles //nolint:staticcheck
		mb.MachineNodeAnnotations, mb.MachineNodeLabels, mb.MachineNodeTaints = ma.MachineNodeAnnotations, ma.MachineNodeLabels, ma.MachineNodeTaints

		if fb, fa := mb.MachineFeatures, ma.MachineFeatures; fb != nil && fa != nil {
			fb.KubernetesTalosAPIAccessConfig, fb.KubePrismSupport, fb.HostDNSSupport = fa.KubernetesTalosAPIAccessConfig, fa.KubePrismSupport, fa.HostDNSSupport
			fb.ImageCacheSupport, fb.FeatureNodeAddressSortAlgorithm = fa.ImageCacheSupport, fa.FeatureNodeAddressSortAlgorithm
		}
	}

	if reflect.DeepEqual(a, b) {
		return nil
	}

	diff, err := configdiff.DiffConfigs(container.NewV1Alpha1(a), container.NewV1Alpha1(b))
	if err != nil {
		return fmt.Errorf("error calculating diff: %w", err)
	}

	return fmt.Errorf("this config change can't be applied in immediate mode\ndiff:\n%s", diff)
}

// commit makes the change of a decided mode.
func (m *Machine) commit(ctx context.Context, mode machine.ApplyConfigurationRequest_Mode, data []byte) error {
	ids := map[machine.ApplyConfigurationRequest_Mode][]resource.ID{
		machine.ApplyConfigurationRequest_TRY:       {talosconfig.ActiveID},
		machine.ApplyConfigurationRequest_NO_REBOOT: {talosconfig.PersistentID, talosconfig.ActiveID},
		machine.ApplyConfigurationRequest_STAGED:    {talosconfig.PersistentID},
		machine.ApplyConfigurationRequest_REBOOT:    {talosconfig.PersistentID},
	}[mode]

	for _, id := range ids {
		if err := m.setConfig(ctx, data, id); err != nil {
			return status.Errorf(codes.Internal, "apply config: %v", err)
		}
	}

	m.logs.servicef("machined", "apply config request: mode %s", strings.ToLower(mode.String()))

	switch mode {
	case machine.ApplyConfigurationRequest_TRY, machine.ApplyConfigurationRequest_NO_REBOOT:
		m.reloadActive(ctx)
	case machine.ApplyConfigurationRequest_REBOOT:
		m.reboot("apply-configuration (reboot mode)", "", false)
	}

	return nil
}

// reloadActive makes the active config effective: the registry resources follow it at once;
// where Talos reloads registry auth live (1.14+), its CRI service controller restarts the
// container runtime when the rendered CRI config changed (Talos's cri.ServiceController: the
// config file's version moved), a moment after the apply answered — until then the runtime
// still pulls with the credential it started with.
func (m *Machine) reloadActive(ctx context.Context) {
	if err := m.syncRegistries(ctx); err != nil {
		m.fleet.log.Warn("sync registries", "node", m.Name, "error", err)
	}

	if !m.liveRegistryAuth() {
		return
	}

	go func() {
		select {
		case <-m.fleet.ctx.Done():
			return
		case <-time.After(m.fleet.opts.CRIRestart):
		}

		m.restartCRI(m.fleet.ctx)
	}()
}

// restartCRI is the CRI service controller's restart: the runtime restarts if its rendered
// config changed, and then pulls with the active config's credential, its service reporting
// the new start.
func (m *Machine) restartCRI(ctx context.Context) {
	m.mu.Lock()
	skip := m.down || m.gone || m.criStuck
	m.mu.Unlock()

	if skip || !m.agent.reload(ctx) {
		return
	}

	cred := m.Configured()

	m.mu.Lock()
	m.effective, m.criStarted = cred, time.Now()
	m.mu.Unlock()

	m.fleet.log.Info("container runtime restarted on its new registry config", "node", m.Name)
}

// tryFor rolls the active config back to the persisted one after timeout (try mode); a later
// apply in another mode, or a reboot, cancels it.
func (m *Machine) tryFor(timeout time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.cancelTry()

	var t *time.Timer

	t = time.AfterFunc(timeout, func() {
		m.mu.Lock()
		current := m.tryRevert == t
		if current {
			m.tryRevert = nil
		}
		m.mu.Unlock()

		if !current {
			return
		}

		if err := m.loadPersisted(m.fleet.ctx); err != nil {
			m.fleet.log.Error("roll back a config applied in try mode", "node", m.Name, "error", err)

			return
		}

		m.logs.servicef("machined", "rolling back the config applied in try mode after %s", timeout)
		m.reloadActive(m.fleet.ctx)
	})
	m.tryRevert = t
}

// cancelTry stops a pending try-mode rollback; the caller holds m.mu.
func (m *Machine) cancelTry() {
	if m.tryRevert != nil {
		m.tryRevert.Stop()
		m.tryRevert = nil
	}
}

// loadPersisted makes the persisted config the active one.
func (m *Machine) loadPersisted(ctx context.Context) error {
	pc, err := m.config(ctx, talosconfig.PersistentID)
	if err != nil {
		return err
	}

	data, err := pc.Provider().Bytes()
	if err != nil {
		return err
	}

	if err := m.setConfig(ctx, data, talosconfig.ActiveID); err != nil {
		return err
	}

	return m.syncRegistries(ctx)
}
