// Package talos talks to nodes' Talos API through the machinery client: it reads the facts the
// planner needs (version, the registry credential's digest in the active and next-boot machine
// configs, when the config last changed, when the container runtime started). It knows nothing
// about fences.
package talos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/pool"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/registryauth"
	"github.com/ghcrsync/ghcrsync/internal/requests"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Client is a Talos API client for the whole fleet; calls target one node each, and every call
// is bounded by the client's timeout (a node whose API accepts and never answers fails that call,
// not the run).
type Client struct {
	c       *client.Client
	timeout time.Duration
	// Requests counts the Talos API calls made.
	Requests *requests.Counter

	// read is each address's next-boot config as ConfigFacts last read it (a write's guard):
	// Configure builds on it, once, when it is fresh, instead of reading it again.
	mu   sync.Mutex
	read map[string]lastRead
	// known are the nodes' facts as their last whole read found them (known.go).
	known map[string]known
	// rt are the runtimes' restart waits asking together (runtimes.go).
	rt runtimes
}

// lastRead is a next-boot config as read, and when; and when the active config last changed,
// as the machine recorded it.
type lastRead struct {
	next    []byte
	at      time.Time
	updated time.Time
}

// freshRead is how old a guard's read may be for a write to build on it (the guard reads right
// before the write; older, the write reads again).
const freshRead = 10 * time.Second

// remember keeps what ConfigFacts read at node for the write that may follow.
func (c *Client) remember(node string, r Read, updated time.Time) {
	if r.next == nil {
		return
	}

	c.mu.Lock()
	defer c.mu.Unlock()

	if c.read == nil {
		c.read = map[string]lastRead{}
	}

	c.read[node] = lastRead{next: r.next, at: time.Now(), updated: updated}
}

// recalled is, once, what a guard read at node within freshRead (next nil: none).
func (c *Client) recalled(node string) lastRead {
	c.mu.Lock()
	defer c.mu.Unlock()

	r, ok := c.read[node]
	delete(c.read, node)

	if !ok || time.Since(r.at) > freshRead {
		return lastRead{}
	}

	return r
}

// DefaultTimeout bounds one Talos call when the configuration sets none.
const DefaultTimeout = 30 * time.Second

// bounded derives a call's context: the node's metadata and the client's deadline.
func (c *Client) bounded(ctx context.Context, node string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)

	return client.WithNode(ctx, node), cancel
}

// Connect builds a client from a talosconfig (path "" follows TALOSCONFIG and ~/.talos/config),
// context ("" = current) and optional endpoints, with gRPC keepalive and timeout per call (0 =
// DefaultTimeout). It reads the file but does not dial.
//
// extra are more gRPC dial options: a test's interceptor, say.
func Connect(ctx context.Context, path, contextName string, endpoints []string, timeout time.Duration, extra ...grpc.DialOption) (*Client, error) {
	cfgPath, err := talosconfigPath(path)
	if err != nil {
		return nil, err
	}

	data, err := readlimit.File(cfgPath, readlimit.Talosconf)
	if err != nil {
		return nil, fmt.Errorf("talosconfig %s: %w (set talos.talosconfig in the configuration, or TALOSCONFIG)", cfgPath, err)
	}

	cfg, err := clientconfig.FromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("talosconfig %s is not a talosconfig: %w", cfgPath, err)
	}

	name := cfg.Context
	if contextName != "" {
		name = contextName
	}

	tctx, ok := cfg.Contexts[name]
	if !ok || tctx == nil {
		return nil, fmt.Errorf("talosconfig %s has no context %q", cfgPath, name)
	}

	if tctx.CA == "" || tctx.Crt == "" || tctx.Key == "" {
		return nil, fmt.Errorf("talosconfig %s, context %q: no client certificate (ca, crt and key are required; generate one with os:admin role)", cfgPath, name)
	}

	counter := &requests.Counter{}
	opts := []client.OptionFunc{client.WithConfig(cfg), client.WithContextName(name),
		client.WithGRPCDialOptions(append([]grpc.DialOption{grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
			grpc.WithChainUnaryInterceptor(counter.UnaryInterceptor()), grpc.WithChainStreamInterceptor(counter.StreamInterceptor())}, extra...)...)}
	if len(endpoints) > 0 {
		opts = append(opts, client.WithEndpoints(endpoints...))
	}

	c, err := client.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("talosconfig %s, context %q: %w", cfgPath, name, err)
	}

	if timeout <= 0 {
		timeout = DefaultTimeout
	}

	return &Client{c: c, timeout: timeout, Requests: counter}, nil
}

// talosconfigPath is path, else TALOSCONFIG, else the first default location that exists
// (found without clientconfig.Open: it creates a missing file).
func talosconfigPath(path string) (string, error) {
	if path != "" {
		return path, nil
	}

	if p := os.Getenv("TALOSCONFIG"); p != "" {
		return p, nil
	}

	paths, err := clientconfig.GetDefaultPaths()
	if err != nil {
		return "", fmt.Errorf("talosconfig: %w (set talos.talosconfig in the configuration, or TALOSCONFIG)", err)
	}

	for _, p := range paths {
		if _, err := os.Stat(p.Path); err == nil {
			return p.Path, nil
		}
	}

	return "", fmt.Errorf("talosconfig: none found (set talos.talosconfig in the configuration, or TALOSCONFIG)")
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

// ConfigFacts reads what the machine configs at at.InternalIP say: the registry credential's
// digest in the active and the next-boot (staged) config, and whether a staged config differs
// from the active. When the caller names the Node the machine is (at.Name, with its uid, boot
// id, and in at.Talos its Talos version and runtime start) — it has just had the machine at
// that address say it is that Node, on this boot — what is read stands for a whole read of it
// (known.go): the proof's read after a live write does, so the late-node relists need not ask
// that machine again.
func (c *Client) ConfigFacts(ctx context.Context, at plan.Node, registry string) (*plan.TalosFacts, error) {
	nctx, cancel := c.bounded(ctx, at.InternalIP)
	defer cancel()

	facts, read, err := c.configFactsAndCredential(nctx, registry)
	if err != nil {
		return nil, err
	}

	c.remember(at.InternalIP, read, facts.ConfigUpdated)

	if at.Name != "" {
		c.vouched(at, facts, read)
	}

	return facts, nil
}

func (c *Client) configFacts(nctx context.Context, registry string) (*plan.TalosFacts, error) {
	facts, _, err := c.configFactsAndCredential(nctx, registry)

	return facts, err
}

// configFactsAndCredential is configFacts, with what the node's configs hold that stays in
// memory (Read).
func (c *Client) configFactsAndCredential(nctx context.Context, registry string) (*plan.TalosFacts, Read, error) {
	active, next, err := c.configs(nctx)
	if err != nil {
		return nil, Read{}, err
	}

	facts := &plan.TalosFacts{ConfiguredDigest: digest(active, registry), ConfigUpdated: active.Metadata().Updated().UTC(),
		KubeletRootDir: keyring.RootDir(active.Provider()), Mirrors: keyring.Mirrors(active.Provider(), registry)}
	facts.StagedDigest, facts.StagedDiffers = facts.ConfiguredDigest, false

	if next != active && !sameBytes(active, next) {
		facts.StagedDigest = digest(next, registry)

		a, errA := registryauth.WithoutDocument(active.Provider(), registry)
		b, errB := registryauth.WithoutDocument(next.Provider(), registry)
		facts.StagedDiffers = errA != nil || errB != nil || !bytes.Equal(a, b)
	}

	read := Read{Credential: registryauth.Credential(active.Provider(), registry)}
	if b, err := next.Provider().Bytes(); err == nil {
		read.next = b
	}

	return facts, read, nil
}

// configs reads the active machine config and the next-boot one (the active one when nothing is
// staged) in one call: a List of the node's MachineConfig resources (Talos keeps the active
// `v1alpha1` and the `persistent` one, which a staged apply moves ahead).
func (c *Client) configs(nctx context.Context) (active, next *talosconfig.MachineConfig, err error) {
	list, err := safe.StateListAll[*talosconfig.MachineConfig](nctx, c.c.COSI)
	if err != nil {
		return nil, nil, fmt.Errorf("read machine config (needs the os:admin role): %w", err)
	}

	for mc := range list.All() {
		switch mc.Metadata().ID() {
		case talosconfig.ActiveID:
			active = mc
		case talosconfig.PersistentID:
			next = mc
		}
	}

	if active == nil {
		return nil, nil, fmt.Errorf("read machine config: the node has no active (%s) machine config", talosconfig.ActiveID)
	}

	if next == nil {
		next = active
	}

	return active, next, nil
}

// sameBytes reports whether two machine configs were read as the same bytes (the usual case:
// nothing staged), which spares decoding the difference.
func sameBytes(a, b *talosconfig.MachineConfig) bool {
	x, errX := a.Provider().Bytes()
	y, errY := b.Provider().Bytes()

	return errX == nil && errY == nil && bytes.Equal(x, y)
}

func digest(mc *talosconfig.MachineConfig, registry string) string {
	return registryauth.Digest(mc.Config(), registry)
}

// Stage is the machine's stage as Talos names it (MachineStatus: "running", "upgrading",
// "rebooting", …): before ghcrsync claims a node, a stage of maintenance is someone else's.
func (c *Client) Stage(ctx context.Context, node string) (string, error) {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	ms, err := safe.StateGetByID[*runtime.MachineStatus](nctx, c.c.COSI, runtime.MachineStatusID)
	if err != nil {
		return "", fmt.Errorf("machine status: %w", err)
	}

	return ms.TypedSpec().Stage.String(), nil
}

// CRIStarted is when the cri service last entered Running (zero if unknown).
func CRIStarted(resp *machine.ServiceListResponse) time.Time {
	var started time.Time

	for _, msg := range resp.GetMessages() {
		if t := criStarted(msg); t.After(started) {
			started = t
		}
	}

	return started
}

func criStarted(msg *machine.ServiceList) time.Time {
	var started time.Time

	for _, svc := range msg.GetServices() {
		if svc.GetId() != "cri" {
			continue
		}

		for _, ev := range svc.GetEvents().GetEvents() {
			if ev.GetState() == "Running" && ev.GetTs().AsTime().After(started) {
				started = ev.GetTs().AsTime().UTC()
			}
		}
	}

	return started
}

// FleetBatch bounds the nodes one one-to-many call addresses.
const FleetBatch = 250

// Read is what FillFacts learns of a node and keeps in memory only, never in its facts (they go
// into the plan file).
type Read struct {
	// Credential is the registry credential the node's active config holds (nil: none, or one
	// ghcrsync cannot read): plan asks the registry whether the credentials in use still pull.
	Credential *credential.Credential
	next       []byte // the next-boot config as read: the base DryRun builds the change on
}

// FillFacts reads every node's facts in as few round-trips as the Talos API allows: the version
// and the service list of up to FleetBatch nodes per call (one-to-many: apid fans the call out to
// the nodes its metadata names and answers for each), then the machine configs and the machine's
// own name together — COSI reads address one node each — with at most parallel nodes in flight.
// Every call is bounded by the client's timeout; a batch whose call fails as a whole (a node
// that never answers holds it to the deadline) is read again node by node, so one bad node fails
// alone. A node whose facts cannot be read gets TalosError instead: the planner fails closed.
//
// It returns, by node name, what it read that stays in memory (Read).
func (c *Client) FillFacts(ctx context.Context, nodes []plan.Node, registry string, parallel int) map[string]Read {
	reads := map[string]Read{}
	reach := c.toRead(ctx, nodes, reads)

	for start := 0; start < len(reach); start += FleetBatch {
		batch := reach[start:min(start+FleetBatch, len(reach))]
		if err := c.fleetFacts(ctx, batch); err != nil {
			each(batch, parallel, func(n *plan.Node) { c.nodeFacts(ctx, n) })
		}
	}

	var mu sync.Mutex

	each(reach, parallel, func(n *plan.Node) {
		if n.TalosError != "" {
			return
		}

		if read, ok := c.machineFacts(ctx, n, registry); ok {
			mu.Lock()
			reads[n.Name] = read
			mu.Unlock()
		}
	})

	for _, n := range reach { // what was read is known; a node whose read failed is asked again next time
		c.learn(n, reads[n.Name])
	}

	return reads
}

// toRead are the nodes FillFacts must ask: every node with an address, but — under Reusing —
// those whose known facts still stand (filled, with their reads, from what is known).
func (c *Client) toRead(ctx context.Context, nodes []plan.Node, reads map[string]Read) []*plan.Node {
	var reach []*plan.Node

	reuse := reusing(ctx)

	for i := range nodes {
		switch {
		case nodes[i].InternalIP == "":
			nodes[i].TalosError = "the Node has no InternalIP to reach its Talos API at"
		case reuse && c.reuse(&nodes[i], reads):
		default:
			reach = append(reach, &nodes[i])
		}
	}

	return reach
}

// machineFacts reads n's machine configs and, in the same round-trip, the machine's own name:
// the facts of another machine at the address (an address reused, a server replaced) are not
// this Node's. The name is asked once for each Node (uid), boot and address (named). It sets
// n.Talos (its version and runtime start kept) or n.TalosError.
func (c *Client) machineFacts(ctx context.Context, n *plan.Node, registry string) (Read, bool) {
	nctx, cancel := c.bounded(ctx, n.InternalIP)
	defer cancel()

	named := make(chan error, 1)
	if c.named(n) {
		named <- nil
	} else {
		go func() { named <- c.isTheNode(nctx, n) }()
	}

	cf, read, err := c.configFactsAndCredential(nctx, registry)
	if errName := <-named; errName != nil {
		n.TalosError, n.Talos, n.TalosDenied = errName.Error(), nil, Denied(errName)

		return Read{}, false
	}

	if err != nil {
		n.TalosError, n.Talos, n.TalosDenied = redact.Error(err), nil, Denied(err)

		return Read{}, false
	}

	cf.Version, cf.CRIStarted = n.Talos.Version, n.Talos.CRIStarted
	n.Talos = cf

	return read, true
}

// isTheNode asks the machine the node's context reaches for its Kubernetes node name (Talos's
// Nodename resource), and refuses a machine that says it is another.
func (c *Client) isTheNode(nctx context.Context, n *plan.Node) error {
	got, err := safe.StateGetByID[*k8s.Nodename](nctx, c.c.COSI, k8s.NodenameID)
	if err != nil {
		return fmt.Errorf("read the node name of the machine at %s: %s", n.InternalIP, redact.Error(err))
	}

	if name := got.TypedSpec().Nodename; name != n.Name {
		return fmt.Errorf("the machine at %s says it is node %s, not %s: what it holds is not this Node's", n.InternalIP, strconv.Quote(name), strconv.Quote(n.Name))
	}

	return nil
}

// each runs f for every node, at most parallel at a time.
func each(nodes []*plan.Node, parallel int, f func(*plan.Node)) {
	pool.Each(len(nodes), parallel, func(i int) { f(nodes[i]) })
}

// fleetFacts reads the version and the service list of a batch of nodes with one call each,
// setting Talos (Version, CRIStarted) or TalosError per node. An error means the calls failed as
// a whole and nothing was set.
func (c *Client) fleetFacts(ctx context.Context, batch []*plan.Node) error {
	addrs := make([]string, 0, len(batch))
	for _, n := range batch {
		addrs = append(addrs, n.InternalIP)
	}

	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	cctx = client.WithNodes(cctx, addrs...)

	ver, err := c.c.MachineClient.Version(cctx, &emptypb.Empty{})
	if err != nil {
		return err
	}

	svc, err := c.c.MachineClient.ServiceList(cctx, &emptypb.Empty{})
	if err != nil {
		return err
	}

	replies := fleetReplies(ver, svc)

	for _, n := range batch {
		r := replies[n.InternalIP]

		switch {
		case r == nil || !r.seen || !r.listed:
			n.TalosError = "its Talos API sent no reply in the one-to-many call for " + n.InternalIP
		case r.err != "":
			n.TalosError = r.err
		case r.version == "":
			n.TalosError = "version: the node's Talos API answered with no version"
		default:
			n.Talos = &plan.TalosFacts{Version: r.version, CRIStarted: r.cri}
		}
	}

	return nil
}

// fleetReply is what a one-to-many call's two answers say of one node (by its address).
type fleetReply struct {
	version, err string
	cri          time.Time
	seen, listed bool
}

// fleetReplies sorts the version and service-list answers of a one-to-many call by node.
func fleetReplies(ver *machine.VersionResponse, svc *machine.ServiceListResponse) map[string]*fleetReply {
	replies := map[string]*fleetReply{}
	at := func(md interface{ GetHostname() string }) *fleetReply {
		r := replies[md.GetHostname()]
		if r == nil {
			r = &fleetReply{}
			replies[md.GetHostname()] = r
		}

		return r
	}

	for _, m := range ver.GetMessages() {
		r := at(m.GetMetadata())
		r.seen, r.version = true, m.GetVersion().GetTag()

		if e := m.GetMetadata().GetError(); e != "" {
			r.err = "version: " + e
		}
	}

	for _, m := range svc.GetMessages() {
		r := at(m.GetMetadata())
		r.listed, r.cri = true, criStarted(m)

		if e := m.GetMetadata().GetError(); e != "" && r.err == "" {
			r.err = "service list: " + e
		}
	}

	return replies
}

// nodeFacts reads one node's version and service list (the one-to-one fallback).
func (c *Client) nodeFacts(ctx context.Context, n *plan.Node) {
	nctx, cancel := c.bounded(ctx, n.InternalIP)
	defer cancel()

	ver, err := c.c.Version(nctx)
	if err != nil {
		n.TalosError, n.TalosDenied = "version: "+redact.Error(err), Denied(err)

		return
	}

	if len(ver.GetMessages()) == 0 {
		n.TalosError = "version: the node's Talos API answered with no message"

		return
	}

	services, err := c.c.ServiceList(nctx)
	if err != nil {
		n.TalosError, n.TalosDenied = "service list: "+redact.Error(err), Denied(err)

		return
	}

	n.TalosError = ""
	n.Talos = &plan.TalosFacts{Version: ver.GetMessages()[0].GetVersion().GetTag(), CRIStarted: CRIStarted(services)}
}

var _ resource.Resource = (*talosconfig.MachineConfig)(nil)

// Denied reports whether Talos refused a call to this identity (PermissionDenied): its role is
// too small for the call.
func Denied(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if st, ok := status.FromError(e); ok && st.Code() == codes.PermissionDenied {
			return true
		}
	}

	return false
}
