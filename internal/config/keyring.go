package config

import (
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
)

// Keyring is nodes.kubelet_keyring: a node whose Talos cannot reload registry auth live (≤ 1.13)
// takes the credential through its kubelet's node keyring (ROOT/config.json, which the kubelet
// sends with every pull and containerd uses before its own), written by a short-lived pod on
// the node — no cordon, drain, reboot or restart. Absent: every such node is fenced and rebooted.
type Keyring struct {
	// Image is the writer's image: ghcrsync's own, by digest, from a registry whose pulls never
	// need the rotated credential (the operator's own; docs/release.md).
	Image string
	// Namespace holds the writer pods and the Secret they read the credential from, and nothing
	// else (`ghcrsync rbac` creates it, under PodSecurity "privileged": the writer mounts the
	// kubelet's root directory).
	Namespace string
	// Secret is that Secret's name.
	Secret string
	// TrustedMirrors are mirror endpoints of the registry that may receive the credential (the
	// kubelet's keyring credential goes to every endpoint containerd pulls from): a node with any
	// other mirror is fenced instead.
	TrustedMirrors []string
	// Window is how long after the write the proof may still fail while the kubelet's cache of
	// the keyring (five minutes) expires; then the node fails, and the next plan fences it.
	Window time.Duration
	// RootDirs are the kubelet root directories a writer pod may mount (the admission policy
	// admits no other hostPath): a node whose kubelet keeps it elsewhere is fenced.
	RootDirs []string
}

// The keyring writer's defaults.
const (
	DefaultKeyringNamespace = "ghcrsync-keyring"
	DefaultKeyringSecret    = "ghcrsync-keyring"
	// DefaultKeyringWindow is the kubelet's five-minute keyring cache and the proof's pull.
	DefaultKeyringWindow = 5*time.Minute + 30*time.Second
	// DefaultKubeletRootDir is the kubelet's root directory on Talos.
	DefaultKubeletRootDir = "/var/lib/kubelet"
)

type keyringBlock struct {
	Image          string         `hcl:"image"`
	Namespace      *string        `hcl:"namespace,optional"`
	Secret         *string        `hcl:"secret,optional"`
	TrustedMirrors []string       `hcl:"trusted_mirrors,optional"`
	RootDirs       []string       `hcl:"root_dirs,optional"`
	Window         hcl.Expression `hcl:"window,optional"`
}

// digestRef is an image reference pinned by digest.
func digestRef(image string) bool {
	_, digest, ok := strings.Cut(image, "@sha256:")

	return ok && len(digest) == 64 && strings.Trim(digest, "0123456789abcdef") == ""
}

// keyring decodes nodes.kubelet_keyring.
// sharedWith is what else the namespace holds that a writer pod mounting the kubelet's root
// directory must not sit beside ("" : nothing ghcrsync knows of).
func sharedWith(namespace string, cfg *Config) string {
	switch {
	case slices.Contains(reservedProbeNamespaces, namespace):
		return "the cluster's or Flux's own service accounts and Secrets"
	case namespace == cfg.Nodes.Probe.Namespace:
		return "the runtime probe's pods (nodes.runtime_probe.namespace), which run under PodSecurity \"restricted\""
	case namespace == cfg.Lease.Namespace:
		return "the run's Lease (lease.namespace)"
	case cfg.State.Backend == "kubernetes" && namespace == cfg.State.Namespace:
		return "the state Secret (state.namespace)"
	}

	return ""
}

func (d *decoder) keyring(b *keyringBlock, body hcl.Body, cfg *Config) *Keyring {
	if b == nil {
		return nil
	}

	at := func(attr string) hcl.Range { return nestedRange(body, "nodes", "kubelet_keyring", attr) }

	k := &Keyring{Image: b.Image, Namespace: DefaultKeyringNamespace, Secret: DefaultKeyringSecret, TrustedMirrors: b.TrustedMirrors,
		Window: d.duration(b.Window, DefaultKeyringWindow, "nodes.kubelet_keyring.window"), RootDirs: []string{DefaultKubeletRootDir}}

	if b.RootDirs != nil {
		k.RootDirs = b.RootDirs
	}

	for _, dir := range k.RootDirs {
		if !strings.HasPrefix(dir, "/") || dir != filepath.Clean(dir) || dir == "/" {
			d.errorf(at("root_dirs"), "Invalid kubelet root directory",
				"nodes.kubelet_keyring.root_dirs lists %q: each must be an absolute, clean path other than / (the writer pod mounts it).", dir)
		}
	}

	if b.Namespace != nil {
		k.Namespace = *b.Namespace
	}

	if b.Secret != nil {
		k.Secret = *b.Secret
	}

	host, _, _ := strings.Cut(k.Image, "/")

	switch {
	case !digestRef(k.Image):
		d.errorf(at("image"), "Keyring writer image not pinned",
			"nodes.kubelet_keyring.image must name ghcrsync's image by digest (REGISTRY/REPO@sha256:…), not %q: the admission policy "+
				"`ghcrsync rbac` renders admits the writer pod with exactly that image.", k.Image)
	case slices.Contains(cfg.registries(), host):
		d.errorf(at("image"), "Keyring writer image on the rotated registry",
			"nodes.kubelet_keyring.image is on %s, the registry whose credential ghcrsync rotates: a node whose keyring holds a revoked "+
				"credential could not pull it, and so could never be mended. Push ghcrsync's image to a registry of your own (docs/release.md).", host)
	}

	if k.Window < time.Minute {
		d.errorf(at("window"), "Keyring window too short",
			"nodes.kubelet_keyring.window is %s: the kubelet reads its keyring again only five minutes after its last read, so a "+
				"shorter window fails nodes whose keyring is about to be read. Leave it out (%s).", k.Window, DefaultKeyringWindow)
	}

	if holds := sharedWith(k.Namespace, cfg); holds != "" {
		d.errorf(at("namespace"), "Keyring namespace not isolated",
			"nodes.kubelet_keyring.namespace is %q, which holds %s: the writer pods there mount the kubelet's root directory, so the "+
				"namespace must hold nothing else. Use a namespace of its own (the default, %q, which `ghcrsync rbac` creates).",
			k.Namespace, holds, DefaultKeyringNamespace)
	}

	return k
}

// registries are the registries of every credential the configuration rotates.
func (c *Config) registries() []string {
	out := []string{c.Credential.Registry}
	for _, t := range c.Tenants {
		out = append(out, t.Credential.Registry)
	}

	return out
}

// nestedRange is the range of attr in the block inner of the top-level block outer (the inner
// block's header when the attribute is absent, the outer's when the inner is).
func nestedRange(body hcl.Body, outer, inner, attr string) hcl.Range {
	content, _, _ := body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: outer}}})
	for _, b := range content.Blocks {
		nested, _, _ := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: inner}}})
		for _, nb := range nested.Blocks {
			if attrs, _ := nb.Body.JustAttributes(); attrs != nil {
				if a, ok := attrs[attr]; ok {
					return a.Range
				}
			}

			return nb.DefRange
		}

		return b.DefRange
	}

	return body.MissingItemRange()
}
