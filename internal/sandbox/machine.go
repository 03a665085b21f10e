package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Role is a machine's Talos machine type.
type Role string

const (
	RoleControlPlane Role = "controlplane"
	RoleWorker       Role = "worker"
)

// Machine is one simulated Talos node: its machine configuration (served through the COSI
// state API), the credential its container runtime actually uses, its boot, and its kubelet.
type Machine struct {
	Name       string
	IP         string
	Role       Role
	Autoscaled bool
	TalosTag   string // e.g. v1.13.9

	fleet    *Fleet
	memberID uint64 // etcd member id (control planes)
	cosi     state.State
	core     state.CoreState
	kubelet  *kubelet

	mu         sync.Mutex
	powerOn    chan struct{} // non-nil while powered off: closed to boot
	bootID     string
	booted     time.Time
	down       bool // rebooting: no kubelet, no Talos API
	gone       bool // deleted
	effective  Credential
	staged     []byte
	criStarted time.Time
	rebootDone chan struct{}
}

// liveRegistryAuth reports whether this Talos reloads registry auth without a reboot (1.14+).
func (m *Machine) liveRegistryAuth() bool { return talosMinor(m.TalosTag) >= 14 }

func newBootID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)

	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// initConfig stores the machine config as both the active and the persistent resource.
func (m *Machine) initConfig(ctx context.Context, data []byte) error {
	m.core = namespaced.NewState(inmem.Build)
	m.cosi = state.WrapCore(m.core)

	for _, id := range []resource.ID{talosconfig.ActiveID, talosconfig.PersistentID} {
		res, err := m.configResource(data, id)
		if err != nil {
			return err
		}

		if err := m.cosi.Create(ctx, res); err != nil {
			return err
		}
	}

	return nil
}

func (m *Machine) configResource(data []byte, id resource.ID) (*talosconfig.MachineConfig, error) {
	provider, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, err
	}

	return talosconfig.NewMachineConfigWithID(provider, id), nil
}

// setConfig replaces the machine config resource with the given ID.
func (m *Machine) setConfig(ctx context.Context, data []byte, id resource.ID) error {
	cur, err := m.cosi.Get(ctx, resource.NewMetadata(talosconfig.NamespaceName, talosconfig.MachineConfigType, id, resource.VersionUndefined))
	if err != nil {
		return err
	}

	res, err := m.configResource(data, id)
	if err != nil {
		return err
	}

	res.Metadata().SetVersion(cur.Metadata().Version())

	return m.cosi.Update(ctx, res)
}

func (m *Machine) config(ctx context.Context, id resource.ID) (*talosconfig.MachineConfig, error) {
	r, err := m.cosi.Get(ctx, resource.NewMetadata(talosconfig.NamespaceName, talosconfig.MachineConfigType, id, resource.VersionUndefined))
	if err != nil {
		return nil, err
	}

	return r.(*talosconfig.MachineConfig), nil
}

// Configured is the registry credential in the machine's active config.
func (m *Machine) Configured() Credential {
	mc, err := m.config(context.Background(), talosconfig.ActiveID)
	if err != nil {
		return Credential{}
	}

	return registryCredential(mc.Config())
}

// Effective is the credential the container runtime pulls with.
func (m *Machine) Effective() Credential {
	m.mu.Lock()
	defer m.mu.Unlock()

	return m.effective
}

// BootID is the current boot's ID ("" while rebooting).
func (m *Machine) BootID() string {
	m.mu.Lock()
	defer m.mu.Unlock()

	if m.down {
		return ""
	}

	return m.bootID
}

// available is the Talos API's view: a rebooting or deleted machine does not answer.
func (m *Machine) available() error {
	m.mu.Lock()
	defer m.mu.Unlock()

	switch {
	case m.gone:
		return status.Errorf(codes.Unavailable, "%s: connection refused (machine deleted)", m.Name)
	case m.down:
		return status.Errorf(codes.Unavailable, "%s: connection refused (rebooting)", m.Name)
	}

	return nil
}

// applyConfiguration implements MachineService.ApplyConfiguration for this machine with the
// semantics of its Talos version: before 1.14 a registry-auth change cannot be applied live,
// so no-reboot refuses it; from 1.14 every change is live and the reboot mode is gone.
func (m *Machine) applyConfiguration(ctx context.Context, req *machine.ApplyConfigurationRequest) (*machine.ApplyConfiguration, error) {
	provider, err := configloader.NewFromBytes(req.GetData())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to parse config: %v", err)
	}

	cur, err := m.config(ctx, talosconfig.ActiveID)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read active config: %v", err)
	}

	if got, want := provider.Machine().Type().String(), cur.Config().Machine().Type().String(); got != want {
		return nil, status.Errorf(codes.InvalidArgument, "machine type change is not supported: %s -> %s", want, got)
	}

	newCred := registryCredential(provider)
	authChanged := newCred != registryCredential(cur.Config())
	needsReboot := authChanged && !m.liveRegistryAuth()
	reply := &machine.ApplyConfiguration{Mode: req.GetMode()}

	if req.GetDryRun() {
		reply.ModeDetails = fmt.Sprintf("Dry run: registry auth changed: %t, needs reboot: %t", authChanged, needsReboot)

		return reply, nil
	}

	mode := req.GetMode()
	if mode == machine.ApplyConfigurationRequest_AUTO {
		mode = machine.ApplyConfigurationRequest_NO_REBOOT
		if needsReboot {
			mode = machine.ApplyConfigurationRequest_REBOOT
		}

		reply.Mode = mode
	}

	switch mode {
	case machine.ApplyConfigurationRequest_TRY:
		return nil, status.Error(codes.Unimplemented, "try mode is not supported by the sandbox")
	case machine.ApplyConfigurationRequest_REBOOT:
		if m.liveRegistryAuth() {
			return nil, status.Error(codes.InvalidArgument, "reboot mode was removed in Talos 1.14: use auto or no-reboot")
		}
	case machine.ApplyConfigurationRequest_NO_REBOOT:
		if needsReboot {
			return nil, status.Errorf(codes.FailedPrecondition,
				"apply configuration: the change to RegistryAuthConfig %q can not be applied without a reboot (Talos %s): use staged mode and reboot", RegistryHost, m.TalosTag)
		}
	}

	m.fleet.countTalosWrite(m.Name)

	switch mode {
	case machine.ApplyConfigurationRequest_STAGED:
		if err := m.setConfig(ctx, req.GetData(), talosconfig.PersistentID); err != nil {
			return nil, status.Errorf(codes.Internal, "stage config: %v", err)
		}

		m.mu.Lock()
		m.staged = append([]byte(nil), req.GetData()...)
		m.mu.Unlock()

		reply.ModeDetails = "Staged configuration to be applied after the next reboot"
	case machine.ApplyConfigurationRequest_NO_REBOOT:
		for _, id := range []resource.ID{talosconfig.PersistentID, talosconfig.ActiveID} {
			if err := m.setConfig(ctx, req.GetData(), id); err != nil {
				return nil, status.Errorf(codes.Internal, "apply config: %v", err)
			}
		}

		m.mu.Lock()
		m.staged = nil
		m.effective = newCred // live reload (or an unchanged credential)
		m.mu.Unlock()

		reply.ModeDetails = "Applied configuration without a reboot"
	case machine.ApplyConfigurationRequest_REBOOT:
		if err := m.setConfig(ctx, req.GetData(), talosconfig.PersistentID); err != nil {
			return nil, status.Errorf(codes.Internal, "stage config: %v", err)
		}

		m.mu.Lock()
		m.staged = append([]byte(nil), req.GetData()...)
		m.mu.Unlock()

		m.reboot("apply-configuration (reboot mode)")

		reply.ModeDetails = "Applied configuration with a reboot"
	}

	return reply, nil
}

// reboot starts a reboot cycle, after the safety witness has judged it. It returns at once,
// like Talos's Reboot API.
func (m *Machine) reboot(cause string) {
	m.fleet.witnessReboot(m, cause)

	m.mu.Lock()
	if m.down || m.gone {
		m.mu.Unlock()

		return
	}

	m.down = true
	done := make(chan struct{})
	m.rebootDone = done
	m.mu.Unlock()

	m.fleet.countReboot(m.Name)
	m.fleet.log.Info("machine rebooting", "node", m.Name, "cause", cause)

	go m.rebootCycle(done)
}

func (m *Machine) rebootCycle(done chan struct{}) {
	defer close(done)

	f := m.fleet
	ctx := f.ctx

	m.kubelet.shutdown(ctx)
	f.endpointDown(m)

	select {
	case <-ctx.Done():
		return
	case <-time.After(f.opts.Reboot):
	}

	// A powered-off machine stays down until powered on.
	m.mu.Lock()
	on := m.powerOn
	m.mu.Unlock()

	if on != nil {
		select {
		case <-ctx.Done():
			return
		case <-on:
		}
	}

	m.mu.Lock()
	if m.gone {
		m.mu.Unlock()

		return
	}

	staged := m.staged
	m.staged = nil
	m.mu.Unlock()

	if staged != nil {
		if err := m.setConfig(ctx, staged, talosconfig.ActiveID); err != nil {
			f.log.Error("apply staged config at boot", "node", m.Name, "error", err)
		}
	} else if mc, err := m.config(ctx, talosconfig.ActiveID); err == nil {
		// The active config is loaded anew at every boot.
		if data, err := mc.Provider().Bytes(); err == nil {
			_ = m.setConfig(ctx, data, talosconfig.ActiveID)
		}
	}

	configured := m.Configured()

	m.mu.Lock()
	m.bootID = newBootID()
	m.booted = time.Now()
	m.effective = configured
	m.criStarted = time.Now()
	m.down = false
	m.mu.Unlock()

	f.log.Info("machine booted", "node", m.Name, "boot_id", m.bootID)
	f.endpointUp(m)
	m.kubelet.boot()
}

// PowerOff takes the machine down (as a reboot does) and keeps it down until PowerOn: an
// outage longer than any timeout. Out of band, so the safety witness judges it.
func (m *Machine) PowerOff() {
	m.mu.Lock()
	if m.powerOn == nil {
		m.powerOn = make(chan struct{})
	}
	m.mu.Unlock()

	m.reboot("power off")
}

// PowerOn lets a powered-off machine boot.
func (m *Machine) PowerOn() {
	m.mu.Lock()
	defer m.mu.Unlock()

	if m.powerOn != nil {
		close(m.powerOn)
		m.powerOn = nil
	}
}

// waitRebooted blocks until a running reboot cycle has finished.
func (m *Machine) waitRebooted(ctx context.Context) error {
	m.mu.Lock()
	done := m.rebootDone
	m.mu.Unlock()

	if done == nil {
		return nil
	}

	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// remove deletes the machine (autoscaler scale-down, or an operator deleting the instance).
func (m *Machine) remove() {
	m.mu.Lock()
	m.gone = true
	m.down = true
	m.mu.Unlock()

	m.kubelet.stop()
}

func talosMinor(tag string) int {
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(tag, "v"), "%d.%d", &major, &minor); err != nil {
		return 0
	}

	return minor
}

// talosTag turns a --talos-version like "1.13" into the tag the machine reports.
func talosTag(version string) (string, error) {
	v := strings.TrimPrefix(version, "v")
	switch strings.Count(v, ".") {
	case 1:
		switch v {
		case "1.13":
			return "v1.13.9", nil
		case "1.14":
			return "v1.14.0", nil
		}
	case 2:
		if talosMinor(v) >= 13 {
			return "v" + v, nil
		}
	}

	return "", errors.New("sandbox: --talos-version must be 1.13 or 1.14 (or a full 1.13+/1.14+ tag)")
}
