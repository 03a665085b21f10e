package talos

import (
	"context"
	"fmt"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	configconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/cri"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
)

// WithRegistryAuth returns the machine config with the registry's credential replaced by a
// RegistryAuthConfig document (Talos merges it over any legacy machine.registries.config auth).
func WithRegistryAuth(cfg config.Provider, registry, username, password string) ([]byte, error) {
	docs := OtherDocuments(cfg, registry)

	auth := cri.NewRegistryAuthConfigV1Alpha1(registry)
	auth.RegistryUsername, auth.RegistryPassword = username, password
	docs = append(docs, auth)

	c, err := container.New(docs...)
	if err != nil {
		return nil, err
	}

	return c.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
}

// OtherDocuments are a config's documents but the registry's RegistryAuthConfig.
func OtherDocuments(cfg config.Provider, registry string) []configconfig.Document {
	docs := make([]configconfig.Document, 0, len(cfg.Documents())+1)

	for _, d := range cfg.Documents() {
		if ra, ok := d.(*cri.RegistryAuthConfigV1Alpha1); ok && ra.Name() == registry {
			continue
		}

		docs = append(docs, d)
	}

	return docs
}

// Configure writes the credential into the node's machine config. When live, the change is
// applied without a reboot (Talos 1.14+); otherwise it is staged for the next boot, since an
// older Talos refuses a no-reboot registry-auth change. The new config is built on the next-boot
// config (so a change an operator staged is kept, never dropped), and read back and checked.
func (c *Client) Configure(ctx context.Context, node, registry, username, password string, live bool) error {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	_, next, err := c.configs(nctx)
	if err != nil {
		return fmt.Errorf("read machine config of %s: %w", node, err)
	}

	data, err := WithRegistryAuth(next.Provider(), registry, username, password)
	if err != nil {
		return fmt.Errorf("build machine config for %s: %w", node, err)
	}

	mode, check := machine.ApplyConfigurationRequest_STAGED, talosconfig.PersistentID
	if live {
		mode, check = machine.ApplyConfigurationRequest_NO_REBOOT, talosconfig.ActiveID
	}

	if _, err := c.c.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: data, Mode: mode}); err != nil {
		return fmt.Errorf("apply machine config to %s (%s): %w", node, mode, err)
	}

	got, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, c.c.COSI, check)
	if err != nil {
		return fmt.Errorf("read back machine config of %s: %w", node, err)
	}

	if digest(got, registry) != authdigest.Of(username, password) {
		return fmt.Errorf("machine config of %s does not carry the new credential after %s apply", node, mode)
	}

	return nil
}

// Reboot asks the node to reboot.
func (c *Client) Reboot(ctx context.Context, node string) error {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	if err := c.c.Reboot(nctx); err != nil {
		return fmt.Errorf("reboot %s: %w", node, err)
	}

	return nil
}

// EtcdHealthy reports an error unless the node's etcd member answers with no errors.
func (c *Client) EtcdHealthy(ctx context.Context, node string) error {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	resp, err := c.c.EtcdStatus(nctx)
	if err != nil {
		return fmt.Errorf("etcd status of %s: %w", node, err)
	}

	for _, m := range resp.GetMessages() {
		if errs := m.GetMemberStatus().GetErrors(); len(errs) > 0 {
			return fmt.Errorf("etcd member on %s reports errors: %v", node, errs)
		}
	}

	return nil
}

// EtcdMembers lists the etcd members' host names, as seen from node.
func (c *Client) EtcdMembers(ctx context.Context, node string) ([]string, error) {
	nctx, cancel := c.bounded(ctx, node)
	defer cancel()

	resp, err := c.c.EtcdMemberList(nctx, &machine.EtcdMemberListRequest{})
	if err != nil {
		return nil, fmt.Errorf("etcd members from %s: %w", node, err)
	}

	var out []string

	for _, m := range resp.GetMessages() {
		for _, mem := range m.GetMembers() {
			out = append(out, mem.GetHostname())
		}
	}

	return out, nil
}
