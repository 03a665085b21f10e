// Package talos talks to nodes' Talos API through the machinery client: it reads the facts the
// planner needs (version, the registry credential's digest in the active and next-boot machine
// configs, when the config last changed, when the container runtime started). It knows nothing
// about fences.
package talos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
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
func Connect(ctx context.Context, path, contextName string, endpoints []string, timeout time.Duration) (*Client, error) {
	cfgPath := path
	if cfgPath == "" {
		cfgPath = os.Getenv("TALOSCONFIG")
	}

	if cfgPath == "" {
		// The default locations, without clientconfig.Open: it creates a missing file.
		paths, err := clientconfig.GetDefaultPaths()
		if err != nil {
			return nil, fmt.Errorf("talosconfig: %w (set talos.talosconfig in the configuration, or TALOSCONFIG)", err)
		}

		for _, p := range paths {
			if _, err := os.Stat(p.Path); err == nil {
				cfgPath = p.Path

				break
			}
		}

		if cfgPath == "" {
			return nil, fmt.Errorf("talosconfig: none found (set talos.talosconfig in the configuration, or TALOSCONFIG)")
		}
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
		client.WithGRPCDialOptions(grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
			grpc.WithChainUnaryInterceptor(counter.UnaryInterceptor()), grpc.WithChainStreamInterceptor(counter.StreamInterceptor()))}
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

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

// Facts reads one node's facts for registry; node is its address.
func (c *Client) Facts(ctx context.Context, node, registry string) (*plan.TalosFacts, error) {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	ver, err := c.c.Version(nctx)
	if err != nil {
		return nil, fmt.Errorf("version: %w", err)
	}

	if len(ver.GetMessages()) == 0 {
		return nil, fmt.Errorf("version: the node's Talos API answered with no message")
	}

	facts, err := c.configFacts(nctx, registry)
	if err != nil {
		return nil, err
	}

	facts.Version = ver.GetMessages()[0].GetVersion().GetTag()

	services, err := c.c.ServiceList(nctx)
	if err != nil {
		return nil, fmt.Errorf("service list: %w", err)
	}

	facts.CRIStarted = CRIStarted(services)

	return facts, nil
}

// ConfigFacts reads what the node's machine configs say: the registry credential's digest in the
// active and the next-boot (staged) config, and whether a staged config differs from the active.
func (c *Client) ConfigFacts(ctx context.Context, node, registry string) (*plan.TalosFacts, error) {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	return c.configFacts(nctx, registry)
}

func (c *Client) configFacts(nctx context.Context, registry string) (*plan.TalosFacts, error) {
	active, next, err := c.configs(nctx)
	if err != nil {
		return nil, err
	}

	facts := &plan.TalosFacts{ConfiguredDigest: digest(active, registry), ConfigUpdated: active.Metadata().Updated().UTC()}
	facts.StagedDigest, facts.StagedDiffers = facts.ConfiguredDigest, false

	if next != active {
		facts.StagedDigest = digest(next, registry)

		a, errA := withoutRegistryAuth(active.Provider(), registry)
		b, errB := withoutRegistryAuth(next.Provider(), registry)
		facts.StagedDiffers = errA != nil || errB != nil || !bytes.Equal(a, b)
	}

	return facts, nil
}

// withoutRegistryAuth encodes a config without the registry's RegistryAuthConfig document: two
// configs equal this way differ at most in the credential ghcrsync manages (a staged config of a
// ghcrsync run that stopped before its reboot is not an operator's change).
func withoutRegistryAuth(cfg config.Provider, registry string) ([]byte, error) {
	c, err := container.New(OtherDocuments(cfg, registry)...)
	if err != nil {
		return nil, err
	}

	return c.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
}

// configs reads the active machine config and the next-boot one (the active one when nothing is
// staged).
func (c *Client) configs(nctx context.Context) (active, next *talosconfig.MachineConfig, err error) {
	active, err = safe.StateGetByID[*talosconfig.MachineConfig](nctx, c.c.COSI, talosconfig.ActiveID)
	if err != nil {
		return nil, nil, fmt.Errorf("read machine config (needs the os:admin role): %w", err)
	}

	next = active

	if persistent, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, c.c.COSI, talosconfig.PersistentID); err == nil {
		next = persistent
	}

	return active, next, nil
}

func digest(mc *talosconfig.MachineConfig, registry string) string {
	return RegistryAuthDigest(mc.Config(), registry)
}

// RegistryAuthDigest is the digest (authdigest) of the credential a machine config gives the
// registry, in either form Talos merges (RegistryAuthConfig documents over the legacy
// machine.registries.config); "" when it gives none. The one rule for nodes and node templates.
func RegistryAuthDigest(c config.Config, registry string) string {
	auth, ok := c.RegistryAuthConfigs()[registry]
	if !ok || auth == nil {
		return ""
	}

	return authdigest.FromFields(auth.Username(), auth.Password(), auth.Auth())
}

// CRIStarted is when the cri service last entered Running (zero if unknown).
func CRIStarted(resp *machine.ServiceListResponse) time.Time {
	var started time.Time

	for _, msg := range resp.GetMessages() {
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
	}

	return started
}

// FillFacts reads every node's facts with at most parallel calls at a time, each bounded by the
// client's timeout. A node whose facts cannot be read gets TalosError instead: the planner fails
// closed.
func (c *Client) FillFacts(ctx context.Context, nodes []plan.Node, registry string, parallel int) {
	sem := make(chan struct{}, max(parallel, 1))

	var wg sync.WaitGroup

	for i := range nodes {
		n := &nodes[i]
		if n.InternalIP == "" {
			n.TalosError = "the Node has no InternalIP to reach its Talos API at"

			continue
		}

		wg.Add(1)

		go func() {
			defer wg.Done()

			sem <- struct{}{}
			defer func() { <-sem }()

			facts, err := c.Facts(ctx, n.InternalIP, registry)
			if err != nil {
				n.TalosError = err.Error()

				return
			}

			n.Talos = facts
		}()
	}

	wg.Wait()
}

var _ resource.Resource = (*talosconfig.MachineConfig)(nil)
