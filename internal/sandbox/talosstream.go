package sandbox

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"strings"
	"sync"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// streamEach runs one per target machine of a streaming call. One-to-one: the machine's stream
// is the call's, with no metadata. One-to-many: every message carries the address the client
// asked for, and a machine's error becomes a message carrying it (as apid's BuildError does).
func streamEach[T any](a *apid, ctx context.Context, send func(T) error, withMeta func(*common.Metadata) T,
	setMeta func(T, *common.Metadata), one func(m *Machine, send func(T) error) error) error {
	names, many, err := a.targets(ctx)
	if err != nil {
		return err
	}

	if !many {
		m, err := a.lookup(ctx, names[0])
		if err != nil {
			return err
		}

		return one(m, send)
	}

	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)

	locked := func(msg T) error {
		mu.Lock()
		defer mu.Unlock()

		return send(msg)
	}

	for _, n := range names {
		wg.Add(1)

		go func() {
			defer wg.Done()

			md := &common.Metadata{Hostname: n}
			m, err := a.lookup(ctx, n)

			if err == nil {
				err = one(m, func(msg T) error {
					setMeta(msg, md)

					return locked(msg)
				})
			}

			if err != nil && ctx.Err() == nil {
				st, _ := status.FromError(err)
				_ = locked(withMeta(&common.Metadata{Hostname: n, Error: err.Error(), Status: st.Proto()}))
			}
		}()
	}

	wg.Wait()

	return nil
}

func dataMeta(md *common.Metadata) *common.Data { return &common.Data{Metadata: md} }

func setDataMeta(d *common.Data, md *common.Metadata) { d.Metadata = md }

// errMachineDown ends a stream whose machine went down: the client sees the connection drop.
var errMachineDown = status.Error(codes.Unavailable, "connection closed: the machine is rebooting")

// Events streams the machine's runtime events: a hello event first (as machined sends), the
// backlog the request asks for, then live events until the machine goes down.
func (a *apid) Events(req *machine.EventsRequest, srv grpc.ServerStreamingServer[machine.Event]) error {
	return streamEach(a, srv.Context(), srv.Send, func(md *common.Metadata) *machine.Event { return &machine.Event{Metadata: md} },
		func(e *machine.Event, md *common.Metadata) { e.Metadata = md },
		func(m *Machine, send func(*machine.Event) error) error {
			log := m.eventLog()
			if err := send(&machine.Event{ActorId: req.GetWithActorId()}); err != nil {
				return err
			}

			backlog, ch, cancel := log.watch(req)
			defer cancel()

			for _, ev := range backlog {
				if err := send(ev); err != nil {
					return err
				}
			}

			for {
				select {
				case <-srv.Context().Done():
					return srv.Context().Err()
				case <-log.down:
					return errMachineDown
				case ev := <-ch:
					if err := send(ev); err != nil {
						return err
					}
				}
			}
		})
}

// Read streams a file. The simulated machine has the files clients read: its boot ID and its
// os-release.
func (a *apid) Read(req *machine.ReadRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	return streamEach(a, srv.Context(), srv.Send, dataMeta, setDataMeta, func(m *Machine, send func(*common.Data) error) error {
		var content string

		switch req.GetPath() {
		case "/proc/sys/kernel/random/boot_id":
			content = m.BootID() + "\n"
		case "/etc/os-release":
			content = "NAME=\"Talos\"\nID=talos\nVERSION_ID=" + m.TalosTag + "\nPRETTY_NAME=\"Talos (" + m.TalosTag + ")\"\n"
		case "/proc/sys/kernel/hostname", "/etc/hostname":
			content = m.Name + "\n"
		default:
			return status.Errorf(codes.NotFound, "stat %s: no such file or directory", req.GetPath())
		}

		return send(&common.Data{Bytes: []byte(content)})
	})
}

// Dmesg streams the kernel log; tail starts at its end, follow keeps streaming.
func (a *apid) Dmesg(req *machine.DmesgRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	return streamEach(a, srv.Context(), srv.Send, dataMeta, setDataMeta, func(m *Machine, send func(*common.Data) error) error {
		tail := -1
		if req.GetTail() {
			tail = 0
		}

		return m.streamLog(srv.Context(), "", tail, req.GetFollow(), send)
	})
}

// Logs streams a system service's log (namespace "system").
func (a *apid) Logs(req *machine.LogsRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	return streamEach(a, srv.Context(), srv.Send, dataMeta, setDataMeta, func(m *Machine, send func(*common.Data) error) error {
		if ns := req.GetNamespace(); ns != "" && ns != "system" {
			return status.Errorf(codes.NotFound, "container %q in namespace %q is not found (the sandbox keeps only system service logs)", req.GetId(), ns)
		}

		tail := int(req.GetTailLines())
		if tail == 0 {
			tail = -1
		}

		return m.streamLog(srv.Context(), req.GetId(), tail, req.GetFollow(), send)
	})
}

// LogsContainers lists the services with a log.
func (a *apid) LogsContainers(ctx context.Context, _ *emptypb.Empty) (*machine.LogsContainersResponse, error) {
	msgs, err := fanOut(a, ctx, func(m *Machine, md *common.Metadata) (*machine.LogsContainer, error) {
		return &machine.LogsContainer{Metadata: md, Ids: m.logs.serviceIDs()}, nil
	}, func(md *common.Metadata) *machine.LogsContainer { return &machine.LogsContainer{Metadata: md} })
	if err != nil {
		return nil, err
	}

	return &machine.LogsContainersResponse{Messages: msgs}, nil
}

// streamLog sends a log's lines (source "" is the kernel's) and, when following, later lines until
// the machine goes down.
func (m *Machine) streamLog(ctx context.Context, source string, tail int, follow bool, send func(*common.Data) error) error {
	lines, ch, cancel, ok := m.logs.read(source, tail, follow)
	defer cancel()

	if !ok {
		return status.Errorf(codes.NotFound, "log %q was not registered", source)
	}

	if len(lines) > 0 {
		if err := send(&common.Data{Bytes: []byte(strings.Join(lines, ""))}); err != nil {
			return err
		}
	}

	if !follow {
		return nil
	}

	down := m.eventLog().down

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-down:
			return errMachineDown
		case line := <-ch:
			if err := send(&common.Data{Bytes: []byte(line)}); err != nil {
				return err
			}
		}
	}
}

// Kubeconfig streams a .tar.gz holding the cluster's admin kubeconfig (control planes only).
func (a *apid) Kubeconfig(_ *emptypb.Empty, srv grpc.ServerStreamingServer[common.Data]) error {
	return streamEach(a, srv.Context(), srv.Send, dataMeta, setDataMeta, func(m *Machine, send func(*common.Data) error) error {
		if m.Role != RoleControlPlane {
			return status.Error(codes.FailedPrecondition, "kubeconfig is only available on control plane nodes")
		}

		kc, err := m.fleet.adminKubeconfig()
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}

		var buf bytes.Buffer

		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)

		if err := tw.WriteHeader(&tar.Header{Name: "kubeconfig", Mode: 0o600, Size: int64(len(kc))}); err != nil {
			return err
		}

		_, _ = tw.Write(kc)
		_ = tw.Close()
		_ = gz.Close()

		return send(&common.Data{Bytes: buf.Bytes()})
	})
}

// Memory reports the machine's memory (a 4 GiB machine).
func (a *apid) Memory(ctx context.Context, _ *emptypb.Empty) (*machine.MemoryResponse, error) {
	const totalKiB = 4 << 20

	msgs, err := fanOut(a, ctx, func(m *Machine, md *common.Metadata) (*machine.Memory, error) {
		return &machine.Memory{Metadata: md, Meminfo: &machine.MemInfo{
			Memtotal: totalKiB, Memfree: totalKiB / 2, Memavailable: totalKiB * 3 / 4, Buffers: 64 << 10, Cached: totalKiB / 8,
		}}, nil
	}, func(md *common.Metadata) *machine.Memory { return &machine.Memory{Metadata: md} })
	if err != nil {
		return nil, err
	}

	return &machine.MemoryResponse{Messages: msgs}, nil
}
