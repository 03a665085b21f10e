package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
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
	// ServerID is its Hetzner Cloud server's ID: its Node's spec.providerID is hcloud://ID.
	ServerID int64

	fleet    *Fleet
	created  time.Time
	memberID uint64 // etcd member id (control planes)
	cosi     state.State
	core     state.CoreState
	api      state.CoreState // core behind Talos's access policy: what the API serves
	agent    agent           // what runs while it is up: kubelet, or real
	kubelet  *kubelet        // the simulated kubelet; nil on a real node
	real     *realNode       // a real containerd and kubelet (Options.RealNodes); nil if simulated
	logs     *logBook

	mu         sync.Mutex
	powerOn    chan struct{} // non-nil while powered off: closed to boot
	bootID     string
	booted     time.Time
	down       bool // rebooting: no kubelet, no Talos API
	gone       bool // deleted
	effective  Credential
	images     map[string]pulledImage // the runtime's image store: it outlives reboots, as containerd's does
	criStarted time.Time
	rebootDone chan struct{}
	events     *eventLog   // this boot's runtime events
	tryRevert  *time.Timer // pending rollback of a config applied in try mode
	hung       bool        // its Talos API accepts calls and never answers
	// stallPods: its container runtime hangs creating containers (a wedged CRI): new pods
	// stay Pending, ContainerCreating, forever.
	stallPods bool
	// notReady, if set, is why its kubelet reports the Node NotReady while it runs (a CNI that
	// never comes up after a boot).
	notReady string
	latency  time.Duration // added before its Talos API answers (a slow machine)
	// keyringMisplaced: its pods' hostPath of the kubelet's root directory is another folder.
	keyringMisplaced bool
	// etcdLearner and etcdAlarm are its etcd member's state (control planes): a learner does
	// not vote; an alarm (NOSPACE, CORRUPT) is raised on the cluster.
	etcdLearner bool
	etcdAlarm   string
	// reportedIP, if set, is the InternalIP its kubelet reports instead of its own: the Node's
	// address moved to another machine (a reused or reassigned IP).
	reportedIP string
	// reportedIPs, when reportsIPs, are the InternalIPs its kubelet reports instead (none, or
	// several: a Node that cannot name one machine).
	reportedIPs []string
	reportsIPs  bool
	// criStuck: its Talos's CRI controller does not restart the runtime after a live write
	// (HoldRuntime): the runtime keeps the credential it started with.
	criStuck bool
	// lostAnswers is how many of its next Talos writes (apply, reboot) are carried out with
	// their answer lost.
	lostAnswers int
}

// LoseAnswers makes the machine carry out its next n Talos writes (ApplyConfiguration, Reboot)
// and lose their answers, as a connection cut mid-answer does.
func (m *Machine) LoseAnswers(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.lostAnswers = n
}

func (m *Machine) loseAnswer() bool {
	m.mu.Lock()
	defer m.mu.Unlock()

	if m.lostAnswers == 0 {
		return false
	}

	m.lostAnswers--

	return true
}

// SetEtcd sets the machine's etcd member state: a learner or a voter, and the alarm it raises
// ("" none, "NOSPACE", "CORRUPT").
func (m *Machine) SetEtcd(learner bool, alarm string) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.etcdLearner, m.etcdAlarm = learner, alarm
}

// etcd is the machine's etcd member state.
func (m *Machine) etcd() (learner bool, alarm string) {
	m.mu.Lock()
	defer m.mu.Unlock()

	return m.etcdLearner, m.etcdAlarm
}

// ReportIP makes the machine's kubelet report ip as its Node's InternalIP ("" its own).
func (m *Machine) ReportIP(ip string) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.reportedIP = ip
}

// ReportIPs makes the machine's kubelet report ips as its Node's InternalIPs (empty: none; nil:
// its own again).
func (m *Machine) ReportIPs(ips []string) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.reportedIPs, m.reportsIPs = slices.Clone(ips), ips != nil
}

// internalIPs are the InternalIPs its kubelet reports.
func (m *Machine) internalIPs() []string {
	m.mu.Lock()
	reported, reports := slices.Clone(m.reportedIPs), m.reportsIPs
	m.mu.Unlock()

	if reports {
		return reported
	}

	return []string{m.internalIP()}
}

// internalIP is the address its kubelet reports.
func (m *Machine) internalIP() string {
	m.mu.Lock()
	defer m.mu.Unlock()

	if m.reportedIP != "" {
		return m.reportedIP
	}

	return m.IP
}

// SetHung makes the machine's Talos API hang (accept calls, never answer) or answer again.
func (m *Machine) SetHung(hung bool) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.hung = hung
}

// StallPods makes the machine's container runtime hang creating containers, or work again.
func (m *Machine) StallPods(stall bool) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.stallPods = stall
}

func (m *Machine) podsStalled() bool {
	m.mu.Lock()
	defer m.mu.Unlock()

	return m.stallPods
}

// SetNotReady makes the machine's kubelet report its Node NotReady with why ("": Ready again).
func (m *Machine) SetNotReady(why string) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.notReady = why
}

func (m *Machine) notReadyReason() string {
	m.mu.Lock()
	defer m.mu.Unlock()

	return m.notReady
}

// HoldRuntime makes the machine's Talos leave its container runtime running after a live write
// changed the registry config (its CRI controller stuck), or restart it again as Talos does.
func (m *Machine) HoldRuntime(hold bool) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.criStuck = hold
}

// SetLatency makes the machine's Talos API answer each call d late (0: at once).
func (m *Machine) SetLatency(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.latency = d
}

// eventLog returns this boot's event log.
func (m *Machine) eventLog() *eventLog {
	m.mu.Lock()
	defer m.mu.Unlock()

	return m.events
}

// liveRegistryAuth reports whether this Talos reloads registry auth without a reboot (1.14+).
func (m *Machine) liveRegistryAuth() bool { return talosMinor(m.TalosTag) >= 14 }

func newBootID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)

	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// initConfig stores the machine config as both the active and the persistent resource, with
// the resources Talos keeps about itself.
func (m *Machine) initConfig(ctx context.Context, data []byte) error {
	m.core = namespaced.NewState(inmem.Build)
	m.cosi = state.WrapCore(m.core)
	m.api = state.Filter(m.core, accessPolicy(m.cosi))
	m.logs = newLogBook()
	m.events = newEventLog()

	for _, id := range []resource.ID{talosconfig.ActiveID, talosconfig.PersistentID} {
		res, err := m.configResource(data, id)
		if err != nil {
			return err
		}

		if err := m.cosi.Create(ctx, res); err != nil {
			return err
		}
	}

	return m.initResources(ctx)
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

// available is the Talos API's view: a rebooting or deleted machine does not answer, and a hung
// one holds the call until the client gives up.
func (m *Machine) available(ctx context.Context) error {
	m.mu.Lock()
	hung, latency := m.hung, m.latency
	m.mu.Unlock()

	if hung {
		<-ctx.Done()

		return status.FromContextError(ctx.Err()).Err()
	}

	if latency > 0 {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-time.After(latency):
		}
	}

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

// reboot starts a reboot cycle. A reboot asked through the Talos API is judged by the safety
// witness first; an out-of-band one (power button, provider maintenance: thirdParty) is only
// counted. It returns at once, like Talos's Reboot API; actor is the request's actor ID,
// carried by the reboot's events.
func (m *Machine) reboot(cause, actor string, thirdParty bool) {
	if thirdParty {
		m.fleet.countThirdPartyReboot()
	} else {
		m.fleet.witnessReboot(m, cause)
	}

	m.mu.Lock()
	if m.down || m.gone {
		m.mu.Unlock()

		return
	}

	m.down = true
	done := make(chan struct{})
	m.rebootDone = done
	events := m.events
	m.mu.Unlock()

	m.shutdownEvents(events, actor)

	m.fleet.countReboot(m.Name)
	m.fleet.log.Info("machine rebooting", "node", m.Name, "cause", cause)

	go m.rebootCycle(done)
}

func (m *Machine) rebootCycle(done chan struct{}) {
	defer close(done)

	f := m.fleet
	ctx := f.ctx

	m.agent.shutdown(ctx)
	f.endpointDown(m)

	select {
	case <-ctx.Done():
		return
	case <-time.After(f.rebootTime()):
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

	m.cancelTry()
	m.mu.Unlock()

	// Talos loads the persisted config at every boot: a staged change takes effect, a config
	// applied in try mode is gone.
	if err := m.loadPersisted(ctx); err != nil {
		f.log.Error("load the persisted config at boot", "node", m.Name, "error", err)
	}

	configured := m.Configured()

	m.mu.Lock()
	m.bootID = newBootID()
	m.booted = time.Now()
	m.effective = configured
	m.criStarted = time.Now()
	m.events = newEventLog()
	m.down = false
	m.mu.Unlock()

	f.log.Info("machine booted", "node", m.Name, "boot_id", m.bootID)
	m.bootEvents(ctx)
	f.endpointUp(m)
	m.agent.boot()
}

// PowerOff takes the machine down (as a reboot does) and keeps it down until PowerOn: an
// outage longer than any timeout, out of band.
func (m *Machine) PowerOff() {
	m.mu.Lock()
	if m.powerOn == nil {
		m.powerOn = make(chan struct{})
	}
	m.mu.Unlock()

	m.reboot("power off", "", true)
}

// PowerOn lets a powered-off machine boot.
// PoweredOff reports whether the machine is off (PowerOff, not yet PowerOn).
func (m *Machine) PoweredOff() bool {
	m.mu.Lock()
	defer m.mu.Unlock()

	return m.powerOn != nil
}

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
	events := m.events
	m.mu.Unlock()

	events.shutdown()

	m.agent.stop()
}

// Real reports whether the machine runs a real containerd and kubelet (Options.RealNodes).
func (m *Machine) Real() bool { return m.real != nil }

func talosMinor(tag string) int {
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(tag, "v"), "%d.%d", &major, &minor); err != nil {
		return 0
	}

	return minor
}

// talosTagFor is the tag of the index-th machine of a fleet whose --talos-version is a
// comma-separated list ("1.13,1.14": a mixed fleet, versions taken in turn).
func talosTagFor(versions string, index int) (string, error) {
	list := strings.Split(versions, ",")

	return talosTag(strings.TrimSpace(list[index%len(list)]))
}

// validTalosVersions checks every version of a --talos-version list.
func validTalosVersions(versions string) error {
	for i := range strings.Split(versions, ",") {
		if _, err := talosTagFor(versions, i); err != nil {
			return err
		}
	}

	return nil
}

// talosTag turns a --talos-version like "1.13" into the tag the machine reports.
func talosTag(version string) (string, error) {
	v := strings.TrimPrefix(version, "v")
	switch strings.Count(v, ".") {
	case 1:
		switch v {
		case "1.11":
			return "v1.11.6", nil // below ghcrsync's minimum: it refuses a RegistryAuthConfig document
		case "1.12":
			return "v1.12.6", nil
		case "1.13":
			return "v1.13.9", nil
		case "1.14":
			return "v1.14.0", nil
		}
	case 2:
		if talosMinor(v) >= 11 {
			return "v" + v, nil
		}
	}

	return "", errors.New("sandbox: --talos-version must be 1.11, 1.12, 1.13 or 1.14 (or a full 1.11+ tag), or a comma-separated list of them")
}
