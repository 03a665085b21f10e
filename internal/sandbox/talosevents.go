package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// maxEvents bounds a machine's event log (machined keeps a bounded ring too).
const maxEvents = 1000

// eventLog is one boot's runtime events, as machined keeps them in memory: a reboot starts a new
// log, and the streams following the old one end (the client sees Unavailable and reconnects).
type eventLog struct {
	mu       sync.Mutex
	events   []*machine.Event
	watchers map[chan *machine.Event]struct{}
	down     chan struct{} // closed when the machine goes down
}

func newEventLog() *eventLog {
	return &eventLog{watchers: map[chan *machine.Event]struct{}{}, down: make(chan struct{})}
}

// publish appends an event with machined's type URL (talos/runtime/<message>) and notifies the
// watchers (a watcher too slow to keep up loses the event, as with a full ring).
func (l *eventLog) publish(payload proto.Message, actor string) {
	data, _ := proto.Marshal(payload)
	ev := &machine.Event{
		Data:    &anypb.Any{TypeUrl: "talos/runtime/" + string(payload.ProtoReflect().Descriptor().FullName()), Value: data},
		Id:      newEventID(),
		ActorId: actor,
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	l.events = append(l.events, ev)
	if len(l.events) > maxEvents {
		l.events = l.events[len(l.events)-maxEvents:]
	}

	for w := range l.watchers {
		select {
		case w <- ev:
		default:
		}
	}
}

// watch returns the backlog the request asks for (tail count, events after an ID, or an actor's)
// and a channel of later events; cancel stops it.
func (l *eventLog) watch(req *machine.EventsRequest) (backlog []*machine.Event, ch chan *machine.Event, cancel func()) {
	l.mu.Lock()
	defer l.mu.Unlock()

	match := func(ev *machine.Event) bool {
		return req.GetWithActorId() == "" || ev.GetActorId() == req.GetWithActorId()
	}

	var since []*machine.Event

	switch {
	case req.GetTailId() != "":
		if i := slices.IndexFunc(l.events, func(ev *machine.Event) bool { return ev.GetId() == req.GetTailId() }); i >= 0 {
			since = l.events[i+1:]
		}
	case req.GetTailEvents() < 0:
		since = l.events
	case req.GetTailEvents() > 0:
		since = l.events[max(0, len(l.events)-int(req.GetTailEvents())):]
	case req.GetTailSeconds() > 0:
		cutoff := time.Now().Add(-time.Duration(req.GetTailSeconds()) * time.Second)
		since = slices.DeleteFunc(slices.Clone(l.events), func(ev *machine.Event) bool { return eventTime(ev.GetId()).Before(cutoff) })
	}

	for _, ev := range since {
		if match(ev) {
			backlog = append(backlog, ev)
		}
	}

	raw := make(chan *machine.Event, 256)
	l.watchers[raw] = struct{}{}

	ch = make(chan *machine.Event, 256)

	stop := make(chan struct{})

	go func() {
		for {
			select {
			case <-stop:
				return
			case ev := <-raw:
				if match(ev) {
					ch <- ev
				}
			}
		}
	}()

	var once sync.Once

	return backlog, ch, func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.watchers, raw)
			l.mu.Unlock()
			close(stop)
		})
	}
}

// shutdown ends the boot's streams.
func (l *eventLog) shutdown() {
	l.mu.Lock()
	defer l.mu.Unlock()

	select {
	case <-l.down:
	default:
		close(l.down)
	}
}

var machineStages = map[runtime.MachineStage]machine.MachineStatusEvent_MachineStage{
	runtime.MachineStageBooting:      machine.MachineStatusEvent_BOOTING,
	runtime.MachineStageRunning:      machine.MachineStatusEvent_RUNNING,
	runtime.MachineStageRebooting:    machine.MachineStatusEvent_REBOOTING,
	runtime.MachineStageShuttingDown: machine.MachineStatusEvent_SHUTTING_DOWN,
}

// machineStatus publishes a MachineStatusEvent (what `talosctl reboot` waits for).
func (l *eventLog) machineStatus(stage runtime.MachineStage, ready bool) {
	ev := &machine.MachineStatusEvent{Stage: machineStages[stage], Status: &machine.MachineStatusEvent_MachineStatus{Ready: ready}}
	if !ready && stage == runtime.MachineStageRunning {
		ev.Status.UnmetConditions = []*machine.MachineStatusEvent_MachineStatus_UnmetCondition{{Name: "nodeReady", Reason: "node is not ready"}}
	}

	l.publish(ev, "")
}

// sequence publishes a sequence's start or stop, with the actor that asked for it.
func (l *eventLog) sequence(name string, action machine.SequenceEvent_Action, actor string) {
	l.publish(&machine.SequenceEvent{Sequence: name, Action: action}, actor)
}

// service publishes a service state change.
func (l *eventLog) service(id, state, msg string) {
	l.publish(&machine.ServiceStateEvent{Service: id, Action: machine.ServiceStateEvent_RUNNING, Message: msg,
		Health: &machine.ServiceHealth{Healthy: state == "Running", LastMessage: msg}}, "")
}

var (
	eventCounter atomic.Uint32
	eventMachine = func() [3]byte {
		var b [3]byte
		_, _ = rand.Read(b[:])

		return b
	}()
	eventEncoding = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)
)

// newEventID makes an event ID in machined's format (an xid: time, machine, pid, counter; 20
// characters of base32hex), so a client can tail from it.
func newEventID() string {
	var b [12]byte

	binary.BigEndian.PutUint32(b[0:4], uint32(time.Now().Unix()))
	copy(b[4:7], eventMachine[:])
	binary.BigEndian.PutUint16(b[7:9], uint16(time.Now().UnixNano()))

	c := eventCounter.Add(1)
	b[9], b[10], b[11] = byte(c>>16), byte(c>>8), byte(c)

	return eventEncoding.EncodeToString(b[:])
}

func eventTime(id string) time.Time {
	b, err := eventEncoding.DecodeString(id)
	if err != nil || len(b) < 4 {
		return time.Time{}
	}

	return time.Unix(int64(binary.BigEndian.Uint32(b[0:4])), 0)
}

// logBook is a machine's logs: the kernel ring (dmesg) and each system service's log, kept
// across reboots (short and simulated, enough for an operator's `talosctl logs` and `dmesg`).
type logBook struct {
	mu       sync.Mutex
	services map[string][]string
	kernel   []string
	follow   map[string]map[chan string]struct{}
}

const maxLogLines = 500

func newLogBook() *logBook {
	return &logBook{services: map[string][]string{}, follow: map[string]map[chan string]struct{}{}}
}

// kernelLine and serviceLine append a line in Talos's rendering and wake the followers.
func (b *logBook) kernelf(format string, args ...any) {
	line := fmt.Sprintf("kern:    info: [%s]: %s\n", time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00"), fmt.Sprintf(format, args...))
	b.append("", line)
}

func (b *logBook) servicef(service, format string, args ...any) {
	line := fmt.Sprintf("%s %s\n", time.Now().UTC().Format("2006/01/02 15:04:05"), fmt.Sprintf(format, args...))
	b.append(service, line)
}

func (b *logBook) append(source, line string) {
	b.mu.Lock()
	defer b.mu.Unlock()

	lines := &b.kernel
	if source != "" {
		l := b.services[source]
		lines = &l
	}

	*lines = append(*lines, line)
	if len(*lines) > maxLogLines {
		*lines = (*lines)[len(*lines)-maxLogLines:]
	}

	if source != "" {
		b.services[source] = *lines
	}

	for ch := range b.follow[source] {
		select {
		case ch <- line:
		default:
		}
	}
}

// read returns the last tail lines of source ("" = kernel; tail < 0: all) and, when follow,
// a channel of later lines; ok is false for a service that has no log.
func (b *logBook) read(source string, tail int, follow bool) (lines []string, ch chan string, cancel func(), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()

	all := b.kernel
	if source != "" {
		all, ok = b.services[source]
		if !ok {
			return nil, nil, func() {}, false
		}
	}

	if tail >= 0 && tail < len(all) {
		all = all[len(all)-tail:]
	}

	lines = append([]string(nil), all...)
	cancel = func() {}

	if follow {
		ch = make(chan string, 256)
		if b.follow[source] == nil {
			b.follow[source] = map[chan string]struct{}{}
		}

		b.follow[source][ch] = struct{}{}
		cancel = func() {
			b.mu.Lock()
			delete(b.follow[source], ch)
			b.mu.Unlock()
		}
	}

	return lines, ch, cancel, true
}

// serviceIDs lists the services with a log.
func (b *logBook) serviceIDs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()

	ids := make([]string, 0, len(b.services))
	for id := range b.services {
		ids = append(ids, id)
	}

	slices.Sort(ids)

	return ids
}

// bootServices are the system services a machine runs, in start order.
func (m *Machine) bootServices() []string {
	s := []string{"machined", "apid", "cri", "kubelet"}
	if m.Role == RoleControlPlane {
		s = append(s, "etcd")
	}

	return s
}

// bootEvents is what a boot leaves behind: the boot sequence's events and logs, the machine
// status (booting, then running and ready), and the resources of a running node.
func (m *Machine) bootEvents(ctx context.Context) {
	ev := m.eventLog()

	m.logs.kernelf("Linux version 6.18.0-talos (%s)", m.TalosTag)
	m.logs.kernelf("Command line: talos.platform=metal console=ttyS0")
	ev.sequence("boot", machine.SequenceEvent_START, "")
	m.setStage(ctx, runtime.MachineStageBooting, false)

	for _, svc := range m.bootServices() {
		m.logs.servicef(svc, "service %q started (boot %s)", svc, m.BootID())
		ev.service(svc, "Running", "Health check successful")
	}

	if err := m.syncStaticPods(ctx); err != nil {
		m.fleet.log.Warn("static pods", "node", m.Name, "error", err)
	}

	m.logs.kernelf("talos: boot sequence: done")
	ev.sequence("boot", machine.SequenceEvent_STOP, "")
	m.setStage(ctx, runtime.MachineStageRunning, true)
}

// shutdownEvents is what a reboot's start leaves behind, before the machine's streams end.
func (m *Machine) shutdownEvents(ev *eventLog, actor string) {
	ctx := m.fleet.ctx

	ev.sequence("reboot", machine.SequenceEvent_START, actor)
	ev.publish(&machine.TaskEvent{Task: "stopAllServices", Action: machine.TaskEvent_START}, actor)
	m.setStage(ctx, runtime.MachineStageRebooting, false)

	for _, svc := range slices.Backward(m.bootServices()) {
		m.logs.servicef(svc, "service %q stopping for a reboot", svc)
	}

	m.logs.kernelf("reboot: Restarting system")
	ev.shutdown()
}
