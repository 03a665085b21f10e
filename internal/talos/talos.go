// Package talos talks to nodes' Talos API through the machinery client: it reads the facts the
// planner needs (version, the registry credential's digest in the active and next-boot machine
// configs, when the config last changed, when the container runtime started). It knows nothing
// about fences.
package talos

import (
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
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Client is a Talos API client for the whole fleet; calls target one node each.
type Client struct {
	c *client.Client
}

// Connect builds a client from a talosconfig (path "" follows TALOSCONFIG and ~/.talos/config),
// context ("" = current) and optional endpoints. It reads the file but does not dial.
func Connect(ctx context.Context, path, contextName string, endpoints []string) (*Client, error) {
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

	data, err := os.ReadFile(cfgPath)
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

	opts := []client.OptionFunc{client.WithConfig(cfg), client.WithContextName(name)}
	if len(endpoints) > 0 {
		opts = append(opts, client.WithEndpoints(endpoints...))
	}

	c, err := client.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("talosconfig %s, context %q: %w", cfgPath, name, err)
	}

	return &Client{c: c}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

// Facts reads one node's facts for registry; node is its address.
func (c *Client) Facts(ctx context.Context, node, registry string) (*plan.TalosFacts, error) {
	nctx := client.WithNode(ctx, node)

	ver, err := c.c.Version(nctx)
	if err != nil {
		return nil, fmt.Errorf("version: %w", err)
	}

	facts := &plan.TalosFacts{Version: ver.GetMessages()[0].GetVersion().GetTag()}

	if facts.ConfiguredDigest, facts.StagedDigest, facts.ConfigUpdated, err = c.digests(nctx, registry); err != nil {
		return nil, err
	}

	services, err := c.c.ServiceList(nctx)
	if err != nil {
		return nil, fmt.Errorf("service list: %w", err)
	}

	facts.CRIStarted = CRIStarted(services)

	return facts, nil
}

// Digests reads the registry credential's digest in the node's active and next-boot (staged)
// machine configs.
func (c *Client) Digests(ctx context.Context, node, registry string) (active, staged string, err error) {
	active, staged, _, err = c.digests(client.WithNode(ctx, node), registry)

	return active, staged, err
}

func (c *Client) digests(nctx context.Context, registry string) (active, staged string, updated time.Time, err error) {
	mc, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, c.c.COSI, talosconfig.ActiveID)
	if err != nil {
		return "", "", time.Time{}, fmt.Errorf("read machine config (needs the os:admin role): %w", err)
	}

	active, updated = digest(mc, registry), mc.Metadata().Updated().UTC()

	if persistent, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, c.c.COSI, talosconfig.PersistentID); err == nil {
		staged = digest(persistent, registry)
	}

	return active, staged, updated, nil
}

func digest(mc *talosconfig.MachineConfig, registry string) string {
	auth, ok := mc.Config().RegistryAuthConfigs()[registry]
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

// FillFacts reads every node's facts with at most parallel calls at a time, each bounded by
// timeout. A node whose facts cannot be read gets TalosError instead: the planner fails closed.
func (c *Client) FillFacts(ctx context.Context, nodes []plan.Node, registry string, parallel int, timeout time.Duration) {
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

			fctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()

			facts, err := c.Facts(fctx, n.InternalIP, registry)
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
