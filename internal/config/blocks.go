// Each block decoded into the configuration, its defaults applied and its rules checked.

package config

import (
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/pin"
	"github.com/ghcrsync/ghcrsync/internal/window"
)

var proveRef = regexp.MustCompile(`^[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[a-f0-9]{64})$`)

func (d *decoder) build(raw *file, body hcl.Body) *Config {
	cfg := &Config{}

	d.connections(raw, body, cfg)
	d.credential(raw, body, cfg)
	d.nodes(raw, body, cfg)
	d.consumers(raw, body, cfg)
	d.distinctConsumers(body, cfg)
	d.flux(raw, body, cfg)
	d.templates(raw, body, cfg)
	d.lease(raw, cfg)
	d.state(raw, cfg)
	d.liveness(raw, body, cfg)
	d.probeNamespace(body, cfg)

	if raw.Nodes != nil {
		cfg.Nodes.Keyring = d.keyring(raw.Nodes.KubeletKeyring, body, cfg)
	}

	d.run(raw, cfg)
	d.others(raw, cfg)

	return cfg
}

// others decodes the maintenance block: where kured and the system-upgrade-controller keep
// their holds, and what a drain held for good does.
func (d *decoder) others(raw *file, cfg *Config) {
	cfg.Others = Others{Kured: DefaultKured, UpgradePlans: DefaultUpgradePlans, HeldDrain: HeldDrainDefer}

	b := raw.Maintenance
	if b == nil {
		return
	}

	if text, rng, ok := d.str(b.Kured, DefaultKured.String()); ok {
		ns, name, cut := strings.Cut(text, "/")

		switch {
		case text == "":
			cfg.Others.Kured = NamespacedName{}
		case !cut || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0:
			d.errorf(rng, "Invalid kured DaemonSet", "maintenance.kured is the namespace/name of kured's DaemonSet, like \"kube-system/kured\" (\"\" : kured is not used); %q is not.", text)
		default:
			cfg.Others.Kured = NamespacedName{Namespace: ns, Name: name}
		}
	}

	if text, rng, ok := d.str(b.UpgradePlans, DefaultUpgradePlans); ok {
		if text != "" && len(validation.IsDNS1123Label(text)) > 0 {
			d.errorf(rng, "Invalid namespace", "maintenance.upgrade_plans is the namespace of the system-upgrade-controller's Plans (\"\" : it is not used); %q is not a namespace.", text)
		}

		cfg.Others.UpgradePlans = text
	}

	if text, rng, ok := d.str(b.HeldDrain, HeldDrainDefer); ok {
		if text != HeldDrainDefer && text != HeldDrainWait {
			d.errorf(rng, "Invalid held_drain", "maintenance.held_drain is %q (defer the node, naming the action) or %q (wait nodes.drain_timeout for someone to act); not %q.",
				HeldDrainDefer, HeldDrainWait, text)
		}

		cfg.Others.HeldDrain = text
	}
}

// run decodes the run block: the time budget of one apply, and its maintenance window.
func (d *decoder) run(raw *file, cfg *Config) {
	cfg.Run = Run{Reserve: DefaultReserve}

	if b := raw.Run; b != nil {
		cfg.Run.Budget = d.duration(b.Budget, 0, "run.budget")
		cfg.Run.Reserve = d.duration(b.Reserve, cfg.Run.Reserve, "run.reserve")

		if text, rng, ok := d.str(b.Window, ""); ok && text != "" {
			w, err := window.Parse(text)
			if err != nil {
				d.errorf(rng, "Invalid maintenance window", "run.window: %v.", err)
			}

			cfg.Run.Window = w
		}
	}
}

// probeNamespace refuses a probe namespace that holds anything a pod could take: apply may
// create pods there.
func (d *decoder) probeNamespace(body hcl.Body, cfg *Config) {
	ns := cfg.Nodes.Probe.Namespace
	if cfg.Nodes.Probe.Image == "" {
		return
	}

	var holds string

	switch {
	case slices.Contains(reservedProbeNamespaces, ns):
		holds = "the cluster's or Flux's own service accounts and Secrets"
	case ns == cfg.Lease.Namespace:
		holds = "the run's Lease (lease.namespace)"
	case cfg.State.Backend == "kubernetes" && ns == cfg.State.Namespace:
		holds = "the state Secret (state.namespace)"
	default:
		return
	}

	d.errorf(attrRange(body, "nodes", "runtime_probe"), "Probe namespace not isolated",
		"nodes.runtime_probe.namespace is %q, which holds %s: apply may create pods in the probe namespace, so it must hold nothing else. "+
			"Use a namespace of its own (the default, %q, which `ghcrsync rbac` creates).", ns, holds, DefaultProbeNamespace)
}

// connections decodes the cluster and talos blocks.
func (d *decoder) connections(raw *file, body hcl.Body, cfg *Config) {
	cfg.Cluster.Timeout, cfg.Talos.Timeout = 30*time.Second, 30*time.Second

	if c := raw.Cluster; c != nil {
		cfg.Cluster.Timeout = d.duration(c.Timeout, cfg.Cluster.Timeout, "cluster.timeout")

		if c.Kubeconfig != nil {
			cfg.Cluster.Kubeconfig = d.existingFile(*c.Kubeconfig, attrRange(body, "cluster", "kubeconfig"), "kubeconfig")
		}

		if c.Context != nil {
			cfg.Cluster.Context = *c.Context
		}

		if c.TemplateKube != nil {
			cfg.Cluster.TemplateKubeconfig = d.existingFile(*c.TemplateKube, attrRange(body, "cluster", "template_kubeconfig"), "template_kubeconfig")
		}

		cfg.Cluster.InCluster = c.InCluster != nil && *c.InCluster
		cfg.Cluster.ServiceAccountDir = DefaultServiceAccountDir

		if c.ServiceAccountDir != nil {
			cfg.Cluster.ServiceAccountDir = d.path(*c.ServiceAccountDir)
		}

		if cfg.Cluster.InCluster && (c.Kubeconfig != nil || c.Context != nil) {
			d.errorf(attrRange(body, "cluster", "in_cluster"), "Conflicting cluster settings",
				"in_cluster = true connects as the pod's service account; remove kubeconfig and context, or in_cluster.")
		}
	}

	cfg.Talos.Concurrency = 64

	if t := raw.Talos; t != nil {
		cfg.Talos.Timeout = d.duration(t.Timeout, cfg.Talos.Timeout, "talos.timeout")
		cfg.Talos.Concurrency = d.atLeastOne(t.Concurrency, cfg.Talos.Concurrency, "talos.concurrency")

		if t.Talosconfig != nil {
			cfg.Talos.Talosconfig = d.existingFile(*t.Talosconfig, attrRange(body, "talos", "talosconfig"), "talosconfig")
		}

		if t.Context != nil {
			cfg.Talos.Context = *t.Context
		}

		cfg.Talos.Endpoints = t.Endpoints
	}
}

// consumers decodes the top-level consumer, consumers and flux_root blocks (the cluster
// credential's).
func (d *decoder) consumers(raw *file, body hcl.Body, cfg *Config) {
	cfg.Consumers, cfg.ConsumerSelector = d.consumerBlocks(raw.Consumers, raw.Selected, attrRange(body, "consumers", "selector"), "")

	if raw.FluxRoot != nil {
		cfg.FluxRoot = &FluxRoot{Namespace: raw.FluxRoot.Namespace, Secret: raw.FluxRoot.Secret,
			ProofTimeout: d.duration(raw.FluxRoot.ProofTimeout, DefaultRootProofTimeout, "flux_root.proof_timeout")}
		if raw.FluxRoot.OCIRepository != nil {
			cfg.FluxRoot.OCIRepository = *raw.FluxRoot.OCIRepository
		}

		cfg.FluxRoot.Prove = cfg.FluxRoot.OCIRepository != "" && (raw.FluxRoot.Prove == nil || *raw.FluxRoot.Prove)
	}
}

// consumerBlocks decodes one credential's consumer and consumers blocks (where, "" or
// `credential "NAME": `, prefixes their messages).
func (d *decoder) consumerBlocks(explicit []consumerBlock, selected *consumersBlock, rng hcl.Range, where string) ([]Consumer, *ConsumerSelector) {
	sas := func(p *[]string) []string {
		if p == nil {
			return []string{"default"}
		}

		return *p
	}

	var out []Consumer

	for _, c := range explicit {
		out = append(out, Consumer{Name: c.Name, Namespace: c.Namespace, Secret: c.Secret, ServiceAccounts: sas(c.ServiceAccounts)})
	}

	var sel *ConsumerSelector

	if c := selected; c != nil {
		if _, err := labels.Parse(c.Selector); err != nil || c.Selector == "" {
			d.errorf(rng, "Invalid selector", "%sconsumers.selector %q is not a Kubernetes label selector.", where, c.Selector)
		}

		sel = &ConsumerSelector{Selector: c.Selector, Secret: c.Secret, ServiceAccounts: sas(c.ServiceAccounts)}
	}

	return out, sel
}

// flux decodes the flux block: each Kustomization to suspend for the run, as namespace/name,
// named once.
func (d *decoder) flux(raw *file, body hcl.Body, cfg *Config) {
	if raw.Flux == nil {
		return
	}

	rng := attrRange(body, "flux", "suspend")

	for _, s := range raw.Flux.Suspend {
		ns, name, ok := strings.Cut(s, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			d.errorf(rng, "Invalid Kustomization", "flux.suspend entries are namespace/name of a Flux Kustomization, like \"flux-system/apps\"; %q is not.", s)

			continue
		}

		n := NamespacedName{Namespace: ns, Name: name}
		if slices.Contains(cfg.FluxSuspend, n) {
			d.errorf(rng, "Duplicate Kustomization", "flux.suspend names %s twice.", s)

			continue
		}

		cfg.FluxSuspend = append(cfg.FluxSuspend, n)
	}

	if raw.Flux.Quiesce == nil || *raw.Flux.Quiesce {
		cfg.FluxQuiesce = d.duration(raw.Flux.QuiesceTimeout, DefaultFluxQuiesce, "flux.quiesce_timeout")
	}
}

// templates decodes the node_template blocks.
func (d *decoder) templates(raw *file, body hcl.Body, cfg *Config) {
	content, _, _ := body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "node_template", LabelNames: []string{"name"}}}})
	seen := map[string]bool{}

	for i, b := range raw.Templates {
		rng := content.Blocks[i].DefRange
		attr := func(name string) hcl.Range {
			if attrs, _ := content.Blocks[i].Body.JustAttributes(); attrs[name] != nil {
				return attrs[name].Range
			}

			return rng
		}

		t := NodeTemplate{Name: b.Name, Namespace: b.Namespace, Secret: b.Secret, Key: b.Key, Format: nodetemplate.FormatHcloud}
		if b.Format != nil {
			t.Format = *b.Format
		}

		if !slices.Contains(nodetemplate.Formats, t.Format) {
			d.errorf(attr("format"), "Unsupported node template format", "format must be one of %s, not %q.", strings.Join(nodetemplate.Formats, ", "), t.Format)
		}

		if b.Pools != nil {
			t.Pools = *b.Pools
			if t.Format != nodetemplate.FormatHcloud {
				d.errorf(attr("pools"), "Pools without a cluster config", "pools select node pools of format %q; a %q template holds one config.", nodetemplate.FormatHcloud, t.Format)
			}
		}

		if b.RestartDeployment != nil {
			ns, name, ok := strings.Cut(*b.RestartDeployment, "/")
			if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				d.errorf(attr("restart_deployment"), "Invalid deployment", "restart_deployment must be \"namespace/name\", not %q.", *b.RestartDeployment)
			}

			t.RestartDeployment = *b.RestartDeployment
		}

		where := t.Namespace + "/" + t.Secret + ":" + t.Key
		if seen[where] {
			d.errorf(rng, "Duplicate node template", "the key %s is managed by another node_template block already.", where)
		}

		seen[where] = true
		cfg.NodeTemplates = append(cfg.NodeTemplates, t)
	}
}

// lease decodes the lease block, with its defaults.
func (d *decoder) lease(raw *file, cfg *Config) {
	cfg.Lease = Lease{Namespace: "flux-system", Name: "ghcr-auth-refresh", Duration: 120 * time.Second, Heartbeat: 30 * time.Second}

	l := raw.Lease
	if l == nil {
		return
	}

	if l.Namespace != nil {
		cfg.Lease.Namespace = *l.Namespace
	}

	if l.Name != nil {
		cfg.Lease.Name = *l.Name
	}

	cfg.Lease.Duration = d.duration(l.Duration, cfg.Lease.Duration, "lease.duration")
	cfg.Lease.Heartbeat = d.duration(l.Heartbeat, cfg.Lease.Heartbeat, "lease.heartbeat")

	if cfg.Lease.Heartbeat*2 > cfg.Lease.Duration {
		d.errorf(l.Heartbeat.Range(), "Lease heartbeat too slow",
			"lease.heartbeat (%s) must be at most half of lease.duration (%s), so that one missed renewal does not lose the Lease.",
			cfg.Lease.Heartbeat, cfg.Lease.Duration)
	}
}

// state decodes the state block, with its defaults.
func (d *decoder) state(raw *file, cfg *Config) {
	cfg.State = State{Backend: "local", Path: d.path("ghcrsync.state.json"), Namespace: "flux-system", Secret: "ghcrsync-state"}

	s := raw.State
	if s == nil {
		return
	}

	backend, rng, _ := d.str(s.Backend, "local")
	if backend != "local" && backend != "kubernetes" {
		d.errorf(rng, "Unsupported state backend", "backend must be \"local\" or \"kubernetes\", not %q.", backend)
	}

	cfg.State.Backend = backend

	if s.Path != nil {
		cfg.State.Path = d.path(*s.Path)
	}

	if s.Namespace != nil {
		cfg.State.Namespace = *s.Namespace
	}

	if s.Secret != nil {
		cfg.State.Secret = *s.Secret
	}
}

// liveness decodes the (at most one) liveness block.
func (d *decoder) liveness(raw *file, body hcl.Body, cfg *Config) {
	switch len(raw.Liveness) {
	case 0:
		return
	case 1:
	default:
		d.errorf(attrRange(body, "liveness", "repository"), "Duplicate liveness block", "Only one liveness block is supported.")

		return
	}

	l := raw.Liveness[0]
	if l.Kind != "github_actions" {
		d.errorf(attrRange(body, "liveness", "repository"), "Unsupported liveness source", "liveness %q is not supported; use liveness \"github_actions\".", l.Kind)
	}

	if strings.Count(l.Repository, "/") != 1 {
		d.errorf(attrRange(body, "liveness", "repository"), "Invalid repository", "repository must be \"owner/name\", not %q.", l.Repository)
	}

	cfg.Liveness = &Liveness{Kind: l.Kind, Repository: l.Repository, APIURL: DefaultGitHubAPI, TokenEnv: "GH_TOKEN",
		TrustedHosts: d.hosts(l.TrustedHosts, attrRange(body, "liveness", "trusted_hosts"))}
	if l.APIURL != nil {
		cfg.Liveness.APIURL = strings.TrimSuffix(*l.APIURL, "/")
		if err := pin.URL(cfg.Liveness.APIURL, append([]string{"api.github.com"}, cfg.Liveness.TrustedHosts...)); err != nil {
			d.errorf(attrRange(body, "liveness", "api_url"), "Untrusted api_url",
				"liveness.api_url receives the GitHub token (%s): %s.", cfg.Liveness.TokenEnv, err)
		}
	}

	if l.TokenEnv != nil {
		cfg.Liveness.TokenEnv = *l.TokenEnv
	}
}

// credential decodes the credential blocks: one is the cluster's (it names no consumers of its
// own), the others tenants' (each names its consumers).
func (d *decoder) credential(raw *file, body hcl.Body, cfg *Config) {
	if len(raw.Credentials) == 0 {
		d.errorf(body.MissingItemRange(), "Missing credential block",
			"The configuration needs one credential \"NAME\" { registry, sops_file } block naming the SOPS file that holds the pull credential.")

		return
	}

	var cluster []string

	seen := map[string]bool{}

	for _, c := range raw.Credentials {
		rng := blockRange(body, "credential", c.Name, "")
		if seen[c.Name] {
			d.errorf(rng, "Duplicate credential block", "Two credential blocks are named %q: give each credential its own name.", c.Name)

			continue
		}

		seen[c.Name] = true

		if !credentialName.MatchString(c.Name) {
			d.errorf(rng, "Invalid credential name",
				"A credential's name is written into the plan, the state and an annotation of every Secret it reaches: lower-case letters, digits and '-', like \"tenant-a\"; %q is not.", c.Name)
		}

		cred := d.oneCredential(c, body)

		switch {
		case c.tenant() && len(raw.Credentials) == 1:
			d.errorf(rng, "Consumers inside the only credential block",
				"consumer and consumers blocks inside a credential block make it a tenant credential, which reaches those pull secrets only; "+
					"with one credential, write them at the top level, where the cluster credential's consumers go.")
		case c.tenant():
			t := Tenant{Credential: cred}
			t.Consumers, t.ConsumerSelector = d.consumerBlocks(c.Consumers, c.Selected, blockRange(body, "credential", c.Name, "consumers"), "credential \""+c.Name+"\": ")
			cfg.Tenants = append(cfg.Tenants, t)
		default:
			cluster = append(cluster, c.Name)
			cfg.Credential = cred
		}
	}

	if len(raw.Credentials) > 1 && len(cluster) != 1 {
		d.errorf(blockRange(body, "credential", raw.Credentials[0].Name, ""), "Which credential is the cluster's?",
			"With several credential blocks, exactly one names no consumers of its own: the cluster's credential, which the nodes (Talos RegistryAuthConfig), "+
				"the node templates, the root Flux secret and the top-level consumers receive; each other block names its tenant's consumers inside it "+
				"(consumer or consumers blocks). Here %d name none (%s).", len(cluster), strings.Join(cluster, ", "))
	}
}

// credentialName is what a credential may be called: a label value (it names the credential on
// the Secrets it reaches).
var credentialName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// distinctConsumers refuses a pull secret two credentials would write (explicit consumers; those
// a selector finds are checked when plan lists them).
func (d *decoder) distinctConsumers(body hcl.Body, cfg *Config) {
	owner := map[string]string{}

	for _, set := range cfg.PullSecretSets() {
		name := set.Credential
		if name == "" {
			name = cfg.Credential.Name
		}

		for _, c := range set.Consumers {
			key := c.Namespace + "/" + c.Secret
			if prev, ok := owner[key]; ok && prev != name {
				d.errorf(blockRange(body, "credential", set.Credential, "consumers"), "Pull secret of two credentials",
					"%s is a consumer of credential %q and of credential %q: a pull secret holds one credential; name it in one block only.", key, prev, name)
			}

			owner[key] = name
		}
	}
}

// oneCredential decodes one credential block.
func (d *decoder) oneCredential(c credentialBlock, body hcl.Body) Credential {
	at := func(attr string) hcl.Range { return blockRange(body, "credential", c.Name, attr) }
	sops, rng, ok := d.str(c.SopsFile, "")

	if ok {
		sops = d.existingFile(sops, rng, "sops_file")
	}

	cred := Credential{
		Where:     blockRange(body, "credential", c.Name, ""),
		SopsWhere: at("sops_file"),
		Name:      c.Name,
		Registry:  c.Registry,
		Endpoint:  "https://" + c.Registry,
		SopsFile:  sops,
		Key:       []string{"stringData", "ghcr_dockerconfigjson"},
		Prove:     c.Prove,
		Deny:      c.Deny,
	}

	if c.Registry == "" || strings.Contains(c.Registry, "/") {
		d.errorf(at("registry"), "Invalid registry",
			"registry is the host name the credential is keyed by in the dockerconfigjson (e.g. \"ghcr.io\"), not %q.", c.Registry)
	}

	cred.TrustedHosts = d.hosts(c.TrustedHosts, at("trusted_hosts"))
	cred.RetryWindow = d.duration(c.RetryWindow, DefaultRetryWindow, "credential.retry_window")
	cred.DeniedWindow = d.duration(c.DeniedWindow, DefaultDeniedWindow, "credential.denied_window")

	if cred.DeniedWindow > cred.RetryWindow {
		d.errorf(at("denied_window"), "Invalid denied_window",
			"credential.denied_window (%s) must not be longer than credential.retry_window (%s): a denial is asked again within the retry window.",
			cred.DeniedWindow, cred.RetryWindow)
	}

	if c.Endpoint != nil {
		cred.Endpoint = d.endpoint(*c.Endpoint, at("endpoint"))
	}

	if len(c.Key) > 0 {
		cred.Key = c.Key
	}

	d.images(c, at)

	return cred
}

// endpoint is credential.endpoint, checked: it receives the credential.
func (d *decoder) endpoint(raw string, rng hcl.Range) string {
	e := strings.TrimSuffix(raw, "/")

	err := pin.URL(e, nil)
	if err == nil {
		err = pin.Base(e)
	}

	if err != nil {
		d.errorf(rng, "Invalid endpoint", "credential.endpoint receives the credential: %s.", err)
	}

	return e
}

// images checks the credential's prove and deny images: references on the registry, none both.
func (d *decoder) images(c credentialBlock, at func(attr string) hcl.Range) {
	for _, p := range c.Prove {
		if !proveRef.MatchString(p) {
			d.errorf(at("prove"), "Invalid image reference",
				"prove entries are repository:tag (or repository@sha256:…) on the registry, like \"org/private-image:v1\"; %q is not.", p)
		}
	}

	for _, p := range c.Deny {
		switch {
		case !proveRef.MatchString(p):
			d.errorf(at("deny"), "Invalid image reference",
				"deny entries are repository:tag (or repository@sha256:…) on the registry the credential must not pull, like \"other-team/private-image:v1\"; %q is not.", p)
		case slices.Contains(c.Prove, p):
			d.errorf(at("deny"), "Image both proved and denied",
				"%q is in credential.prove (must pull) and credential.deny (must not pull): keep it in one.", p)
		}
	}
}

// nodePolicies are the nodes block's autoscaler_candidates and verdict scope.
func (d *decoder) nodePolicies(b *nodesBlock) (autoscaler, verdict string) {
	autoscaler, rng, _ := d.str(b.AutoscalerCandidates, AutoscalerInclude)
	if !slices.Contains([]string{AutoscalerDeselect, AutoscalerInclude}, autoscaler) {
		d.errorf(rng, "Invalid autoscaler_candidates", "autoscaler_candidates must be \"deselect\" or \"include\", not %q.", autoscaler)
	}

	verdict, rng, _ = d.str(b.Verdict, VerdictCluster)
	if verdict != VerdictCluster && verdict != VerdictSelected {
		d.errorf(rng, "Invalid verdict scope", "nodes.verdict must be \"cluster\" (judge every Node) or \"selected\" (only those nodes.selector selects), not %q.", verdict)
	}

	return autoscaler, verdict
}

func (d *decoder) nodes(raw *file, body hcl.Body, cfg *Config) {
	n := Nodes{AutoscalerCandidates: AutoscalerInclude, WorkerParallelism: 1, LiveParallelism: 10, MaxFailures: 1, DrainTimeout: 45 * time.Minute, ReadyTimeout: 10 * time.Minute,
		Verdict: VerdictCluster, ExpectedNodeTime: DefaultExpectedNodeTime, ExpectedLiveTime: DefaultExpectedLiveTime}

	if len(cfg.Credential.Prove) > 0 {
		n.Probe = Probe{Image: cfg.Credential.Registry + "/" + cfg.Credential.Prove[0]}
	}

	n.Probe.Namespace, n.Probe.ServiceAccount = DefaultProbeNamespace, DefaultProbeServiceAccount

	if b := raw.Nodes; b != nil {
		if b.Selector != nil {
			if _, err := labels.Parse(*b.Selector); err != nil {
				d.errorf(attrRange(body, "nodes", "selector"), "Invalid selector", "selector %q is not a Kubernetes label selector: %v.", *b.Selector, err)
			}

			n.Selector = *b.Selector
		}

		n.Exclude = b.Exclude
		n.AutoscalerCandidates, n.Verdict = d.nodePolicies(b)

		n.WorkerParallelism = d.atLeastOne(b.WorkerParallelism, n.WorkerParallelism, "worker_parallelism")
		n.LiveParallelism = d.atLeastOne(b.LiveParallelism, n.LiveParallelism, "live_parallelism")
		n.MaxFailures = d.atLeastOne(b.MaxFailures, n.MaxFailures, "max_failures")

		n.DrainTimeout = d.duration(b.DrainTimeout, n.DrainTimeout, "nodes.drain_timeout")
		n.ExpectedNodeTime = d.duration(b.ExpectedNodeTime, n.ExpectedNodeTime, "nodes.expected_node_time")
		n.ExpectedLiveTime = d.duration(b.ExpectedLiveTime, n.ExpectedLiveTime, "nodes.expected_live_time")
		n.ReadyTimeout = d.duration(b.ReadyTimeout, n.ReadyTimeout, "nodes.ready_timeout")

		if b.AllowQuorumLoss != nil {
			n.AllowQuorumLoss = *b.AllowQuorumLoss
		}

		d.probe(b.RuntimeProbe, body, &n.Probe)
	}

	if n.Probe.Image != "" && len(n.Probe.Images) == 0 {
		n.Probe.Images = []string{n.Probe.Image}
	}

	for _, img := range n.Probe.Images {
		if !strings.HasPrefix(img, cfg.Credential.Registry+"/") {
			d.errorf(attrRange(body, "nodes", "runtime_probe"), "Invalid probe image",
				"nodes.runtime_probe.image must be an image on the credential's registry (%s/…): it proves the node's credential for that registry, not %q.",
				cfg.Credential.Registry, img)
		}
	}

	cfg.Nodes = n
}

// probe reads nodes.runtime_probe over the defaults in pr.
func (d *decoder) probe(p *probeBlock, body hcl.Body, pr *Probe) {
	if p == nil {
		return
	}

	if p.Image != nil {
		pr.Image = *p.Image
	}

	switch {
	case p.Images != nil && p.Image != nil:
		d.errorf(attrRange(body, "nodes", "runtime_probe"), "Conflicting probe images", "set nodes.runtime_probe.image or images, not both.")
	case p.Images != nil && len(*p.Images) == 0:
		d.errorf(attrRange(body, "nodes", "runtime_probe"), "No probe images", "nodes.runtime_probe.images lists no image.")
	case p.Images != nil:
		pr.Image, pr.Images = (*p.Images)[0], slices.Clone(*p.Images)
	}

	if p.Namespace != nil {
		pr.Namespace = *p.Namespace
	}

	if p.ServiceAccount != nil {
		pr.ServiceAccount = *p.ServiceAccount
	}
}
