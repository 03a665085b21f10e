package sandbox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"runtime"
	"slices"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	cosiserver "github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	clusterres "github.com/siderolabs/talos/pkg/machinery/resources/cluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Talos roles, carried as the Organization of the client certificate.
const (
	roleAdmin    = "os:admin"
	roleOperator = "os:operator"
	roleReader   = "os:reader"
)

// apid is the simulated Talos API endpoint. Like Talos's apid it terminates mTLS, checks the
// client's role, and routes each call by the `node` (one-to-one) or `nodes` (one-to-many,
// responses aggregated with per-node metadata) gRPC metadata to the machines.
type apid struct {
	machine.UnimplementedMachineServiceServer

	fleet *Fleet
	ca    *authority // the Talos CA: what GenerateClientConfiguration signs with
	srv   *grpc.Server
	addr  string
}

func startAPID(f *Fleet, ca *authority) (*apid, error) {
	serving, err := ca.serving("apid", []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
	if err != nil {
		return nil, err
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.certPEM())

	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{*serving.Certificate},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	})

	a := &apid{fleet: f, ca: ca}
	a.srv = grpc.NewServer(grpc.Creds(creds),
		grpc.ChainUnaryInterceptor(a.authorizeUnary),
		grpc.ChainStreamInterceptor(a.authorizeStream))

	machine.RegisterMachineServiceServer(a.srv, a)
	cosiv1alpha1.RegisterStateServer(a.srv, &cosiRouter{apid: a})

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}

	a.addr = l.Addr().String()

	go func() { _ = a.srv.Serve(l) }()

	return a, nil
}

func (a *apid) stop() { a.srv.Stop() }

// methodRoles lists which roles may call each method, as machined's authorization table says;
// anything unlisted is admin-only. COSI reads are further filtered per resource type
// (accessPolicy: sensitive types need os:admin).
var methodRoles = map[string][]string{
	"/machine.MachineService/Version":        {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/ServiceList":    {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/EtcdMemberList": {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/EtcdStatus":     {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/EtcdAlarmList":  {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/Events":         {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/Memory":         {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/Dmesg":          {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/Logs":           {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/LogsContainers": {roleAdmin, roleOperator, roleReader},
	"/machine.MachineService/Reboot":         {roleAdmin, roleOperator},
	"/cosi.resource.State/Get":               {roleAdmin, roleOperator, roleReader},
	"/cosi.resource.State/List":              {roleAdmin, roleOperator, roleReader},
	"/cosi.resource.State/Watch":             {roleAdmin, roleOperator, roleReader},
}

// hasRole reports whether the client's certificate carries role.
func hasRole(ctx context.Context, role string) bool { return slices.Contains(roles(ctx), role) }

func roles(ctx context.Context) []string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}

	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil
	}

	return info.State.PeerCertificates[0].Subject.Organization
}

// clientIdentity is the common name of the client's certificate.
func clientIdentity(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}

	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return ""
	}

	return info.State.PeerCertificates[0].Subject.CommonName
}

func authorize(ctx context.Context, method string) error {
	allowed, ok := methodRoles[method]
	if !ok {
		allowed = []string{roleAdmin}
	}

	for _, r := range roles(ctx) {
		if slices.Contains(allowed, r) {
			return nil
		}
	}

	return status.Errorf(codes.PermissionDenied, "not authorized: %s needs one of %v", method, allowed)
}

func (a *apid) authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}

	return h(ctx, req)
}

func (a *apid) authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}

	return h(srv, ss)
}

// targets resolves the call's node metadata. oneToMany is true for `nodes`.
func (a *apid) targets(ctx context.Context) (names []string, oneToMany bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)

	if v := md.Get("nodes"); len(v) > 0 {
		return v, true, nil
	}

	if v := md.Get("node"); len(v) > 0 {
		return v[:1], false, nil
	}

	// No node: the endpoint answers for itself (the first control plane).
	for _, m := range a.fleet.Machines() {
		if m.Role == RoleControlPlane {
			return []string{m.IP}, false, nil
		}
	}

	return nil, false, status.Error(codes.Unavailable, "no control plane")
}

func (a *apid) lookup(ctx context.Context, target string) (*Machine, error) {
	m, ok := a.fleet.Machine(target)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "%s: connection error: dial tcp %s:50000: connect: no route to host", target, target)
	}

	return m, m.available(ctx)
}

// fanOut calls one per target machine. One-to-one (the `node` metadata, or none): the machine
// answers with no metadata, as machined does, and its error is the call's. One-to-many (`nodes`):
// apid sets each reply's hostname to the node address the client asked for, and a machine's
// error becomes a reply carrying that error and its status.
func fanOut[T any](a *apid, ctx context.Context, one func(*Machine, *common.Metadata) (T, error), failed func(*common.Metadata) T) ([]T, error) {
	names, many, err := a.targets(ctx)
	if err != nil {
		return nil, err
	}

	out := make([]T, 0, len(names))

	for _, n := range names {
		var md *common.Metadata
		if many {
			md = &common.Metadata{Hostname: n}
		}

		m, err := a.lookup(ctx, n)

		var msg T
		if err == nil {
			msg, err = one(m, md)
		}

		if err != nil {
			if !many {
				return nil, err
			}

			st, _ := status.FromError(err)
			msg = failed(&common.Metadata{Hostname: n, Error: err.Error(), Status: st.Proto()})
		}

		out = append(out, msg)
	}

	return out, nil
}

func (a *apid) Version(ctx context.Context, _ *emptypb.Empty) (*machine.VersionResponse, error) {
	msgs, err := fanOut(a, ctx, func(m *Machine, md *common.Metadata) (*machine.Version, error) {
		return &machine.Version{
			Metadata: md,
			Version: &machine.VersionInfo{
				Tag: m.TalosTag, Sha: "sandbox", Built: "2026-10-01T00:00:00Z",
				GoVersion: runtime.Version(), Os: "linux", Arch: "amd64",
			},
			Platform: &machine.PlatformInfo{Name: "metal", Mode: "metal"},
			Features: &machine.FeaturesInfo{Rbac: true},
		}, nil
	}, func(md *common.Metadata) *machine.Version { return &machine.Version{Metadata: md} })
	if err != nil {
		return nil, err
	}

	return &machine.VersionResponse{Messages: msgs}, nil
}

func (a *apid) ApplyConfiguration(ctx context.Context, req *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	msgs, err := fanOut(a, ctx, func(m *Machine, md *common.Metadata) (*machine.ApplyConfiguration, error) {
		reply, err := m.applyConfiguration(ctx, req)
		if err != nil {
			return nil, err
		}

		if m.loseAnswer() && !req.GetDryRun() { // applied; its answer never arrives
			return nil, status.Error(codes.Unavailable, "connection reset by peer (the sandbox lost this answer)")
		}

		reply.Metadata = md

		return reply, nil
	}, func(md *common.Metadata) *machine.ApplyConfiguration {
		return &machine.ApplyConfiguration{Metadata: md}
	})
	if err != nil {
		return nil, err
	}

	return &machine.ApplyConfigurationResponse{Messages: msgs}, nil
}

func (a *apid) Reboot(ctx context.Context, req *machine.RebootRequest) (*machine.RebootResponse, error) {
	msgs, err := fanOut(a, ctx, func(m *Machine, md *common.Metadata) (*machine.Reboot, error) {
		actor := newBootID()
		m.fleet.witnessLease(ctx, m, "Reboot API")
		m.reboot("Reboot API ("+req.GetMode().String()+")", actor, false)

		if m.loseAnswer() { // rebooting; its answer never arrives
			return nil, status.Error(codes.Unavailable, "connection reset by peer (the sandbox lost this answer)")
		}

		return &machine.Reboot{Metadata: md, ActorId: actor}, nil
	}, func(md *common.Metadata) *machine.Reboot { return &machine.Reboot{Metadata: md} })
	if err != nil {
		return nil, err
	}

	return &machine.RebootResponse{Messages: msgs}, nil
}

func (a *apid) ServiceList(ctx context.Context, _ *emptypb.Empty) (*machine.ServiceListResponse, error) {
	msgs, err := fanOut(a, ctx, func(m *Machine, md *common.Metadata) (*machine.ServiceList, error) {
		m.mu.Lock()
		booted, cri := m.booted, m.criStarted
		m.mu.Unlock()

		svc := func(id string, started time.Time) *machine.ServiceInfo {
			return &machine.ServiceInfo{
				Id: id, State: "Running",
				Health: &machine.ServiceHealth{Healthy: true, LastChange: timestamppb.New(started)},
				Events: &machine.ServiceEvents{Events: []*machine.ServiceEvent{
					{Msg: "Starting service", State: "Starting", Ts: timestamppb.New(started)},
					{Msg: "Health check successful", State: "Running", Ts: timestamppb.New(started)},
				}},
			}
		}

		services := []*machine.ServiceInfo{svc("apid", booted), svc("cri", cri), svc("kubelet", cri), svc("machined", booted)}
		if m.Role == RoleControlPlane {
			services = append(services, svc("etcd", booted))
		}

		return &machine.ServiceList{Metadata: md, Services: services}, nil
	}, func(md *common.Metadata) *machine.ServiceList { return &machine.ServiceList{Metadata: md} })
	if err != nil {
		return nil, err
	}

	return &machine.ServiceListResponse{Messages: msgs}, nil
}

// errNotControlPlane is machined's answer to an etcd API call on a worker.
func errNotControlPlane(api string) error {
	return status.Errorf(codes.Unimplemented, "%s is only available on control plane nodes", api)
}

func (a *apid) EtcdMemberList(ctx context.Context, _ *machine.EtcdMemberListRequest) (*machine.EtcdMemberListResponse, error) {
	msgs, err := fanOut(a, ctx, func(m *Machine, md *common.Metadata) (*machine.EtcdMembers, error) {
		if m.Role != RoleControlPlane {
			return nil, errNotControlPlane("member list")
		}

		var members []*machine.EtcdMember

		for _, cp := range a.fleet.Machines() {
			if cp.Role != RoleControlPlane {
				continue
			}

			learner, _ := cp.etcd()

			members = append(members, &machine.EtcdMember{
				Id: cp.memberID, Hostname: cp.Name, IsLearner: learner,
				PeerUrls:   []string{"https://" + cp.IP + ":2380"},
				ClientUrls: []string{"https://" + cp.IP + ":2379"},
			})
		}

		return &machine.EtcdMembers{Metadata: md, Members: members}, nil
	}, func(md *common.Metadata) *machine.EtcdMembers { return &machine.EtcdMembers{Metadata: md} })
	if err != nil {
		return nil, err
	}

	return &machine.EtcdMemberListResponse{Messages: msgs}, nil
}

// EtcdAlarmList lists the alarms raised on the etcd cluster (every member's), as etcd's
// AlarmList does from any member.
func (a *apid) EtcdAlarmList(ctx context.Context, _ *emptypb.Empty) (*machine.EtcdAlarmListResponse, error) {
	msgs, err := fanOut(a, ctx, func(m *Machine, md *common.Metadata) (*machine.EtcdAlarm, error) {
		if m.Role != RoleControlPlane {
			return nil, errNotControlPlane("etcd alarm list")
		}

		var alarms []*machine.EtcdMemberAlarm

		for _, cp := range a.fleet.Machines() {
			if _, alarm := cp.etcd(); cp.Role == RoleControlPlane && alarm != "" {
				alarms = append(alarms, &machine.EtcdMemberAlarm{MemberId: cp.memberID,
					Alarm: machine.EtcdMemberAlarm_AlarmType(machine.EtcdMemberAlarm_AlarmType_value[alarm])})
			}
		}

		return &machine.EtcdAlarm{Metadata: md, MemberAlarms: alarms}, nil
	}, func(md *common.Metadata) *machine.EtcdAlarm { return &machine.EtcdAlarm{Metadata: md} })
	if err != nil {
		return nil, err
	}

	return &machine.EtcdAlarmListResponse{Messages: msgs}, nil
}

func (a *apid) EtcdStatus(ctx context.Context, _ *emptypb.Empty) (*machine.EtcdStatusResponse, error) {
	msgs, err := fanOut(a, ctx, func(m *Machine, md *common.Metadata) (*machine.EtcdStatus, error) {
		if m.Role != RoleControlPlane {
			return nil, errNotControlPlane("etcd status")
		}

		var leader uint64

		for _, cp := range a.fleet.Machines() {
			if cp.Role == RoleControlPlane && cp.BootID() != "" {
				leader = cp.memberID

				break
			}
		}

		learner, alarm := m.etcd()

		var errs []string
		if alarm != "" { // etcd reports a raised alarm in the member's status errors
			errs = append(errs, fmt.Sprintf("memberID:%d alarm:%s", m.memberID, alarm))
		}

		return &machine.EtcdStatus{Metadata: md, MemberStatus: &machine.EtcdMemberStatus{
			MemberId: m.memberID, ProtocolVersion: "3.6.0", StorageVersion: "3.6.0",
			DbSize: 8 << 20, DbSizeInUse: 4 << 20, Leader: leader, IsLearner: learner, Errors: errs,
			RaftIndex: uint64(time.Now().Unix()), RaftTerm: 2, RaftAppliedIndex: uint64(time.Now().Unix()),
		}}, nil
	}, func(md *common.Metadata) *machine.EtcdStatus { return &machine.EtcdStatus{Metadata: md} })
	if err != nil {
		return nil, err
	}

	return &machine.EtcdStatusResponse{Messages: msgs}, nil
}

// cosiRouter serves the COSI State API of the machine named by the `node` metadata, backed
// by that machine's in-memory COSI state holding Talos's own resource types, behind Talos's
// access policy (read-only; registered types and namespaces only; sensitive types need os:admin).
type cosiRouter struct {
	cosiv1alpha1.UnimplementedStateServer

	apid *apid
}

// state is the COSI state of the machine the call targets. Discovery members are listed from the
// fleet as they are asked for (a node discovers the others; the fleet changes under it).
func (r *cosiRouter) state(ctx context.Context, typ ...string) (*cosiserver.State, error) {
	names, many, err := r.apid.targets(ctx)
	if err != nil {
		return nil, err
	}

	if many && len(names) != 1 {
		return nil, status.Error(codes.InvalidArgument, "one-to-many proxying is not supported for COSI methods")
	}

	m, err := r.apid.lookup(ctx, names[0])
	if err != nil {
		return nil, err
	}

	if slices.Contains(typ, clusterres.MemberType) {
		if err := m.syncMembers(ctx); err != nil {
			return nil, status.Errorf(codes.Internal, "discovery: %v", err)
		}
	}

	return cosiserver.NewState(m.api), nil
}

func (r *cosiRouter) Get(ctx context.Context, req *cosiv1alpha1.GetRequest) (*cosiv1alpha1.GetResponse, error) {
	st, err := r.state(ctx, req.GetType())
	if err != nil {
		return nil, err
	}

	return st.Get(ctx, req)
}

func (r *cosiRouter) List(req *cosiv1alpha1.ListRequest, srv grpc.ServerStreamingServer[cosiv1alpha1.ListResponse]) error {
	st, err := r.state(srv.Context(), req.GetType())
	if err != nil {
		return err
	}

	return st.List(req, srv)
}

func (r *cosiRouter) Watch(req *cosiv1alpha1.WatchRequest, srv grpc.ServerStreamingServer[cosiv1alpha1.WatchResponse]) error {
	st, err := r.state(srv.Context(), req.GetType())
	if err != nil {
		return err
	}

	return st.Watch(req, srv)
}

func (r *cosiRouter) Create(ctx context.Context, req *cosiv1alpha1.CreateRequest) (*cosiv1alpha1.CreateResponse, error) {
	st, err := r.state(ctx)
	if err != nil {
		return nil, err
	}

	return st.Create(ctx, req)
}

func (r *cosiRouter) Update(ctx context.Context, req *cosiv1alpha1.UpdateRequest) (*cosiv1alpha1.UpdateResponse, error) {
	st, err := r.state(ctx)
	if err != nil {
		return nil, err
	}

	return st.Update(ctx, req)
}

func (r *cosiRouter) Destroy(ctx context.Context, req *cosiv1alpha1.DestroyRequest) (*cosiv1alpha1.DestroyResponse, error) {
	st, err := r.state(ctx)
	if err != nil {
		return nil, err
	}

	return st.Destroy(ctx, req)
}
