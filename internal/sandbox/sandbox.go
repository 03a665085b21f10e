// Package sandbox runs a local stand-in for a Talos Linux Kubernetes cluster on loopback: a
// real etcd, kube-apiserver, kube-controller-manager and kube-scheduler; simulated machines
// whose kubelets use the real API with node identities and whose Talos API is the real
// MachineService and COSI State gRPC API, served over mTLS behind one apid-style endpoint; a
// cluster-autoscaler simulation; a real OCI registry behind token auth; a fake of the GitHub
// Actions run-attempt API; and SOPS/age fixtures. It never leaks into the product binary.
package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/siderolabs/crypto/x509"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/zclconf/go-cty/cty"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/ghcrsync/ghcrsync/config/examples"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/permission"
	"github.com/ghcrsync/ghcrsync/internal/release"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
)

// Options configure a sandbox. Zero values take the defaults of `ghcrsync-sandbox up`.
type Options struct {
	Dir           string
	BinDir        string // control-plane binaries; default ControlPlaneDir()
	ControlPlanes int
	Workers       int
	Autoscaled    int
	Seed          int64
	Heartbeat     time.Duration
	Reboot        time.Duration
	// RebootMax, when above Reboot, makes each reboot take a duration drawn (seeded) between
	// Reboot and RebootMax: a real fleet's spread, scaled down.
	RebootMax           time.Duration
	AutoscalerInterval  time.Duration
	AutoscalerScaleRate float64 // chance per tick of a scale-down and of a scale-up; 0 = only on request
	AutoscalerPaused    bool
	// Autoscaler is AutoscalerSim (the default: the seeded simulation) or AutoscalerReal (the
	// real cluster-autoscaler against a fake Hetzner Cloud API; make cluster-autoscaler).
	Autoscaler string
	// Flux is FluxSim (the default: Flux's kinds, nothing reading them) or FluxReal (Flux's
	// source-controller and kustomize-controller: `make flux`).
	Flux         string
	TalosVersion string
	VIP          bool
	InSync       bool // start the fleet on the secret file's credential
	NoWorkloads  bool // skip the demo Deployment
	// TalosLatency and APILatency add a round-trip at the Talos API endpoint and the
	// Kubernetes API endpoint (a delay line in front of each): a WAN between the CI runner and
	// the cluster.
	TalosLatency time.Duration
	APILatency   time.Duration
	// RealNodes is how many static workers (prod-worker-1, …) run a real containerd (Debian's,
	// with runc) and a real kubelet instead of the simulated one; their Talos API, boot and
	// reboot stay simulated (make runtime kubelet; RealNodeBinaries).
	RealNodes int
	// CRIRestart is how long after a live apply (Talos 1.14+) the machine's CRI service
	// controller restarts the runtime on its new registry config; default 1 s.
	CRIRestart time.Duration
	// KeyringWriter, when set, is the ghcrsync binary the sandbox publishes as the operator's own
	// image of ghcrsync (in the public registry, by digest), and configures as the kubelet
	// keyring's writer (nodes.kubelet_keyring): simulated kubelets run it as a process, real
	// nodes as a container.
	KeyringWriter string
	// KeyringCache is how long a simulated kubelet keeps what it read of its keyring before it
	// reads the file again; default the real kubelet's five minutes (keyring.CacheLifetime).
	KeyringCache time.Duration
	Logger       hclog.Logger
}

func (o *Options) defaults() {
	if o.ControlPlanes == 0 {
		o.ControlPlanes = 3
	}

	if o.Seed == 0 {
		o.Seed = 1
	}

	if o.Heartbeat == 0 {
		o.Heartbeat = 10 * time.Second
	}

	if o.Reboot == 0 {
		o.Reboot = 5 * time.Second
	}

	if o.AutoscalerInterval == 0 {
		o.AutoscalerInterval = 10 * time.Second
	}

	if o.CRIRestart == 0 {
		o.CRIRestart = time.Second
	}

	if o.TalosVersion == "" {
		o.TalosVersion = "1.13"
	}

	if o.KeyringCache == 0 {
		o.KeyringCache = keyring.CacheLifetime
	}

	if o.Flux == "" {
		o.Flux = FluxSim
	}

	if o.Autoscaler == "" {
		o.Autoscaler = AutoscalerSim
	}

	if o.BinDir == "" {
		o.BinDir = ControlPlaneDir()
	}

	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
}

// ControlPlaneDir is where scripts/build-control-plane.sh caches the binaries.
func ControlPlaneDir() string {
	return CachePath("GHCRSYNC_CONTROL_PLANE_DIR", "control-plane", "k8s-v1.37.2-etcd-v3.6.16")
}

// Sandbox is a running sandbox.
type Sandbox struct {
	opts   Options
	ctx    context.Context
	cancel context.CancelFunc

	cp       *controlPlane
	fleet    *Fleet
	registry *registry.Registry
	// public is another registry, anonymous: registry.k8s.io's stand-in (the pod sandbox image)
	// and the operator's own registry (ghcrsync's image), on a host of their own, so no
	// credential of ghcr.io's stand-in is ever sent there.
	public *registry.Registry
	// writerImage is ghcrsync's image in the public registry, by digest (Options.KeyringWriter).
	writerImage string
	ci          *ciAPI
	apid        *apid
	autoscaler  *autoscaler
	real        *realAutoscaler // AutoscalerReal
	flux        *realFlux       // FluxReal
	admin       *adminAPI
	// delays are the delay lines in front of the endpoints (TalosLatency, APILatency);
	// talosAddr is where clients reach the Talos API (apid, or its delay line).
	delays    []*delayLine
	talosAddr string

	realKubelet string // the real nodes' kubelet binary

	credMu           sync.Mutex
	oldCred, newCred Credential
	ageRecipient     string
}

// Files the sandbox writes into its directory.
const (
	KubeconfigFile        = "kubeconfig"
	TalosconfigFile       = "talosconfig"
	TalosconfigReaderFile = "talosconfig-reader"
	// TalosconfigOperatorFile is an os:admin talosconfig for a person (the operator in tests):
	// its writes are not ghcrsync's, so the interleaving witness does not judge them.
	TalosconfigOperatorFile = "talosconfig-operator"
	AgeKeyFile              = "age.key"
	SecretFile              = "secret.enc.yaml"
	EnvFile                 = "env"
	ConfigFile              = "ghcrsync.hcl"
	ReadyFile               = "ready"
	InfoFile                = "sandbox.json"
)

// The run Lease the sandbox's ghcrsync.hcl names; the interleaving witness reads it.
const (
	LeaseNamespace = "flux-system"
	LeaseName      = "ghcr-auth-refresh"
	// writerRepository is ghcrsync's image in the operator's own registry (the public one).
	writerRepository = "platform/ghcrsync"
	// ProbeNamespace and ProbeServiceAccount are where and as whom the runtime probe runs.
	ProbeNamespace      = "ghcrsync-probe"
	ProbeServiceAccount = "ghcrsync-probe"
)

// GhcrsyncTalosIdentity is the common name of TalosconfigFile's certificate: ghcrsync's
// identity towards Talos in the sandbox.
const GhcrsyncTalosIdentity = "sandbox-admin"

// Start brings a sandbox up and returns once every node is Ready and the files are written.
func Start(ctx context.Context, opts Options) (_ *Sandbox, err error) {
	opts.defaults()

	if opts.Dir == "" {
		return nil, errors.New("sandbox: a directory is required")
	}

	if err := validTalosVersions(opts.TalosVersion); err != nil {
		return nil, err
	}

	if opts.RealNodes > opts.Workers {
		return nil, fmt.Errorf("sandbox: %d real nodes of %d workers: real nodes are static workers", opts.RealNodes, opts.Workers)
	}

	if opts.Flux != FluxSim && opts.Flux != FluxReal {
		return nil, fmt.Errorf("sandbox: flux %q: want %q or %q", opts.Flux, FluxSim, FluxReal)
	}

	if opts.Autoscaler != AutoscalerSim && opts.Autoscaler != AutoscalerReal {
		return nil, fmt.Errorf("sandbox: autoscaler %q: want %q or %q", opts.Autoscaler, AutoscalerSim, AutoscalerReal)
	}

	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}

	opts.Dir = dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}

	_ = os.Remove(filepath.Join(dir, ReadyFile))

	sctx, cancel := context.WithCancel(context.Background())
	s := &Sandbox{opts: opts, ctx: sctx, cancel: cancel}

	defer func() {
		if err != nil {
			s.Stop()
		}
	}()

	log := opts.Logger
	start := time.Now()

	sub, err := pickSubnet(mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid()))))
	if err != nil {
		return nil, err
	}

	endpointHost, owner := sub.host(0), "prod-control-plane-1"
	if opts.VIP {
		endpointHost, owner = sub.vip(), ""
	}

	sans := []net.IP{net.ParseIP(sub.vip())}
	for i := range opts.ControlPlanes {
		sans = append(sans, net.ParseIP(sub.host(i)))
	}

	s.cp, err = startControlPlane(ctx, controlPlaneOptions{
		binDir:    opts.BinDir,
		dir:       dir,
		extraSANs: sans,
		nodeGrace: max(5*time.Second, 4*opts.Heartbeat),
		logf:      func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...)) },
	})
	if err != nil {
		return nil, err
	}

	admin, err := kubernetes.NewForConfig(s.cp.admin)
	if err != nil {
		return nil, err
	}

	if err := s.cp.waitHealthy(ctx, admin); err != nil {
		return nil, err
	}

	if s.registry, err = registry.Start(); err != nil {
		return nil, err
	}

	if s.public, err = registry.Start(); err != nil {
		return nil, err
	}

	if opts.KeyringWriter != "" {
		// The image a team ships (make release's), of the binary given, for this machine.
		idx, err := release.ImageIndex(map[string]string{"linux/" + runtime.GOARCH: opts.KeyringWriter},
			release.ImageSource{Version: "sandbox"}, time.Unix(0, 0))
		if err != nil {
			return nil, fmt.Errorf("sandbox: the keyring writer's image: %w", err)
		}

		digest, err := s.public.PushImageIndex(writerRepository+":writer", idx, true)
		if err != nil {
			return nil, fmt.Errorf("sandbox: the keyring writer's image: %w", err)
		}

		s.writerImage = s.public.Addr() + "/" + writerRepository + "@" + digest
	}

	if opts.RealNodes > 0 {
		if err := s.realNodes(); err != nil {
			return nil, err
		}
	}

	s.oldCred, s.newCred = newCredential("fleet-old"), newCredential("fleet-new")
	s.registry.AddCredential(s.oldCred.Username, s.oldCred.Password)
	s.registry.AddCredential(s.newCred.Username, s.newCred.Password)

	if s.ci, err = startCIAPI(); err != nil {
		return nil, err
	}

	fleetCred := s.oldCred
	if opts.InSync {
		fleetCred = s.newCred
	}

	f := &Fleet{
		ctx: sctx, opts: opts, log: log, admin: admin, cp: s.cp, reg: s.registry, pub: s.public, net: sub,
		realNames: map[string]bool{}, realKubelet: s.realKubelet,
		rng:      mrand.New(mrand.NewPCG(uint64(opts.Seed), 0x5eed)),
		machines: map[string]*Machine{}, byIP: map[string]*Machine{}, started: time.Now(),
		stats:       Stats{TalosWrites: map[string]int{}, Reboots: map[string]int{}},
		pullSources: map[string]string{},
	}
	apiTarget, err := s.delayed(s.cp.apiAddr, opts.APILatency)
	if err != nil {
		return nil, err
	}

	f.endpoint = &endpointProxy{host: endpointHost, target: apiTarget, owner: owner, fleet: f}
	s.fleet = f

	if err := f.endpoint.open(); err != nil {
		return nil, fmt.Errorf("sandbox: API endpoint %s: %w", f.endpoint.addr(), err)
	}

	talosCA, err := newAuthority("talos")
	if err != nil {
		return nil, err
	}

	f.talosCA = talosCA

	if s.apid, err = startAPID(f, talosCA); err != nil {
		return nil, err
	}

	if s.talosAddr, err = s.delayed(s.apid.addr, opts.TalosLatency); err != nil {
		return nil, err
	}

	for i := range opts.ControlPlanes {
		if _, err := f.addMachine(ctx, fmt.Sprintf("prod-control-plane-%d", i+1), RoleControlPlane, false, fleetCred, nil); err != nil {
			return nil, err
		}
	}

	for i := range opts.RealNodes {
		f.realNames[fmt.Sprintf("prod-worker-%d", i+1)] = true
	}

	for i := range opts.Workers {
		if _, err := f.addMachine(ctx, fmt.Sprintf("prod-worker-%d", i+1), RoleWorker, false, fleetCred, nil); err != nil {
			return nil, err
		}
	}

	for range opts.Autoscaled {
		if _, err := f.addMachine(ctx, f.autoscaledName(), RoleWorker, true, fleetCred, nil); err != nil {
			return nil, err
		}
	}

	if err := s.seedCluster(ctx, admin); err != nil {
		return nil, err
	}

	if err := f.writeTemplate(ctx, fleetCred); err != nil {
		return nil, fmt.Errorf("sandbox: node template: %w", err)
	}

	if err := s.WaitNodesReady(ctx, 60*time.Second); err != nil {
		return nil, err
	}

	if err := s.writeFiles(talosCA); err != nil {
		return nil, err
	}

	if err := f.createAutoscalerDeployment(ctx); err != nil {
		return nil, err
	}

	s.autoscaler = newAutoscaler(f)

	if opts.Autoscaler == AutoscalerReal {
		if s.real, err = startRealAutoscaler(ctx, s); err != nil {
			return nil, err
		}

		s.real.paused = opts.AutoscalerPaused
		if err := s.real.run(); err != nil {
			return nil, err
		}

		f.watchAutoscalerDeployment(func() {
			if err := s.real.restart(); err != nil {
				log.Warn("cluster-autoscaler did not start", "error", err)
			}
		})
	} else {
		s.autoscaler.setPaused(opts.AutoscalerPaused)
		s.autoscaler.start()
		f.watchAutoscalerDeployment(s.autoscaler.restart)
	}

	if opts.Flux == FluxReal {
		if s.flux, err = startRealFlux(ctx, s); err != nil {
			return nil, err
		}
	}

	if s.admin, err = startAdminAPI(s); err != nil {
		return nil, err
	}

	if err := s.writeInfo(); err != nil {
		return nil, err
	}

	if err := os.WriteFile(filepath.Join(dir, ReadyFile), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		return nil, err
	}

	log.Info("sandbox ready", "dir", dir, "nodes", len(f.Machines()), "took", time.Since(start).Round(time.Millisecond))

	return s, nil
}

// seedCluster creates the namespaces ghcrsync uses and, unless disabled, a small workload
// (a DaemonSet and a Deployment with a PodDisruptionBudget) pulling a private image.
func (s *Sandbox) seedCluster(ctx context.Context, kube kubernetes.Interface) error {
	for _, ns := range []string{"flux-system", "apps"} {
		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}

	// The probe's namespace (PodSecurity "restricted") and its own service account, as `ghcrsync
	// rbac` renders them: no pull secret for the ServiceAccount admission plugin to add to the
	// probe pods.
	probe := permission.ProbeObjects(ProbeNamespace, permission.ProbeShape{ServiceAccount: ProbeServiceAccount})

	_, err := kube.CoreV1().Namespaces().Create(ctx, probe[0].(*corev1.Namespace), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}

	_, err = kube.CoreV1().ServiceAccounts(ProbeNamespace).Create(ctx, probe[1].(*corev1.ServiceAccount), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}

	if s.writerImage != "" {
		s.fleet.RunImage(s.writerImage, ProcessImage{Binary: s.opts.KeyringWriter, Entrypoint: keyring.Binary, User: 65532, Group: 65532})

		for _, o := range permission.KeyringObjects(config.DefaultKeyringNamespace) {
			if _, err := kube.CoreV1().Namespaces().Create(ctx, o.(*corev1.Namespace), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		}
	}

	cred := s.oldCred
	if s.opts.InSync {
		cred = s.newCred
	}

	if err := s.seedFanOut(ctx, kube, cred, !s.opts.NoWorkloads); err != nil {
		return err
	}

	if s.opts.NoWorkloads {
		return nil
	}

	return createDemoWorkloads(ctx, kube)
}

// WaitNodesReady waits until every machine's Node is Ready.
func (s *Sandbox) WaitNodesReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)

	for {
		notReady := []string{}

		for _, m := range s.fleet.Machines() {
			n, err := s.Kube().CoreV1().Nodes().Get(ctx, m.Name, getOpts)
			if err != nil || !NodeReady(n) {
				notReady = append(notReady, m.Name)
			}
		}

		if len(notReady) == 0 {
			return nil
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: nodes not Ready after %s: %s", timeout, strings.Join(notReady, ", "))
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// NodeReady reports the Node's Ready condition.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}

	return false
}

func (s *Sandbox) writeFiles(talosCA *authority) error {
	dir := s.opts.Dir
	p := func(name string) string { return filepath.Join(dir, name) }

	adminKP, err := s.cp.kubeCA.client("sandbox-admin", "system:masters")
	if err != nil {
		return err
	}

	if err := writeKubeconfig(p(KubeconfigFile), s.fleet.endpoint.url(), s.cp.kubeCA.certPEM(), adminKP.CrtPEM, adminKP.KeyPEM); err != nil {
		return err
	}

	var nodes []string
	for _, m := range s.fleet.Machines() {
		if m.Role == RoleControlPlane {
			nodes = append(nodes, m.IP)

			break
		}
	}

	for file, id := range map[string]struct{ cn, role string }{
		TalosconfigFile:         {GhcrsyncTalosIdentity, roleAdmin},
		TalosconfigReaderFile:   {"sandbox-reader", roleReader},
		TalosconfigOperatorFile: {"operator", roleAdmin},
	} {
		kp, err := talosCA.client(id.cn, id.role)
		if err != nil {
			return err
		}

		cfg := clientconfig.NewConfig("sandbox", []string{s.talosAddr}, talosCA.certPEM(),
			&x509.PEMEncodedCertificateAndKey{Crt: kp.CrtPEM, Key: kp.KeyPEM})
		cfg.Contexts["sandbox"].Nodes = nodes

		if err := cfg.Save(p(file)); err != nil {
			return err
		}

		if err := os.Chmod(p(file), 0o600); err != nil {
			return err
		}
	}

	identity, recipient, err := secretfile.NewAgeKey()
	if err != nil {
		return err
	}

	s.ageRecipient = recipient

	if err := os.WriteFile(p(AgeKeyFile), identity, 0o600); err != nil {
		return err
	}

	enc, err := secretfile.Encrypt(DockerConfigJSON(s.newCred), recipient)
	if err != nil {
		return err
	}

	if err := os.WriteFile(p(SecretFile), enc, 0o600); err != nil {
		return err
	}

	hcl, err := s.renderConfig()
	if err != nil {
		return err
	}

	if err := os.WriteFile(p(ConfigFile), hcl, 0o600); err != nil {
		return err
	}

	return nil
}

// renderConfig fills config/examples/sandbox.hcl in for this sandbox: where ghcr.io is served,
// and a short Lease so that recovery tests are quick.
func (s *Sandbox) renderConfig() ([]byte, error) {
	src, err := examples.FS.ReadFile("sandbox.hcl")
	if err != nil {
		return nil, err
	}

	f, diags := hclwrite.ParseConfig(src, "sandbox.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("sandbox: config/examples/sandbox.hcl: %s", diags.Error())
	}

	for _, b := range f.Body().Blocks() {
		switch b.Type() {
		case "credential":
			b.Body().SetAttributeValue("endpoint", cty.StringVal(s.registry.URL()))
		case "flux_root":
			// Nothing reconciles the stand-in OCIRepository: only real Flux can prove the root.
			if s.opts.Flux != FluxReal {
				b.Body().SetAttributeValue("prove", cty.False)
			}
		case "flux":
			// Nor takes a suspension: only real Flux's kustomize-controller answers one.
			if s.opts.Flux != FluxReal {
				b.Body().SetAttributeValue("quiesce", cty.False)
			}
		case "lease":
			b.Body().SetAttributeValue("namespace", cty.StringVal(LeaseNamespace))
			b.Body().SetAttributeValue("name", cty.StringVal(LeaseName))
			b.Body().SetAttributeValue("duration", cty.StringVal("15s"))
			b.Body().SetAttributeValue("heartbeat", cty.StringVal("5s"))
		case "liveness":
			b.Body().SetAttributeValue("api_url", cty.StringVal(s.ci.url()))
		case "nodes":
			// Fewer than three control planes keep no quorum through a reboot: the small
			// fleets' configurations say so, as a user must.
			if s.opts.ControlPlanes < 3 {
				b.Body().SetAttributeValue("allow_quorum_loss", cty.True)
			}

			// The kubelet keyring's writer: ghcrsync's image from the operator's registry; the
			// real nodes' mirror of ghcr.io is the registry standing in for ghcr.io itself.
			if s.writerImage != "" {
				k := b.Body().AppendNewBlock("kubelet_keyring", nil).Body()
				k.SetAttributeValue("image", cty.StringVal(s.writerImage))
				k.SetAttributeValue("trusted_mirrors", cty.ListVal([]cty.Value{cty.StringVal(s.registry.URL())}))

				// A real node's kubelet keeps its root directory in the node's own folder.
				dirs := []cty.Value{cty.StringVal(config.DefaultKubeletRootDir)}
				for _, m := range s.fleet.Machines() {
					if m.Real() {
						dirs = append(dirs, cty.StringVal(m.KubeletRootDir()))
					}
				}

				k.SetAttributeValue("root_dirs", cty.ListVal(dirs))
			}
		}
	}

	return f.Bytes(), nil
}

func (s *Sandbox) writeEnv() error {
	lines := []string{
		"KUBECONFIG=" + filepath.Join(s.opts.Dir, KubeconfigFile),
		"TALOSCONFIG=" + filepath.Join(s.opts.Dir, TalosconfigFile),
		"SOPS_AGE_KEY_FILE=" + filepath.Join(s.opts.Dir, AgeKeyFile),
		"GHCRSYNC_SANDBOX_ADMIN=" + s.admin.url(),
		"GHCRSYNC_SANDBOX_REGISTRY=" + s.registry.URL(),
		"GHCRSYNC_SANDBOX_CI_API=" + s.ci.url(),
	}

	var b strings.Builder
	for _, l := range lines {
		b.WriteString("export " + l + "\n")
	}

	return os.WriteFile(filepath.Join(s.opts.Dir, EnvFile), []byte(b.String()), 0o600)
}

// delayed returns where to reach target with rtt added to each round-trip: a delay line in
// front of it, or target itself when rtt is 0.
func (s *Sandbox) delayed(target string, rtt time.Duration) (string, error) {
	if rtt <= 0 {
		return target, nil
	}

	d, err := startDelayLine(target, rtt)
	if err != nil {
		return "", err
	}

	s.delays = append(s.delays, d)

	return d.addr(), nil
}

// Stop stops everything the sandbox started and waits for its child processes to exit.
func (s *Sandbox) Stop() {
	if s.autoscaler != nil {
		s.autoscaler.stop()
	}

	if s.real != nil {
		s.real.stop()
	}

	if s.flux != nil {
		s.flux.stop()
	}

	if s.admin != nil {
		s.admin.close()
	}

	if s.fleet != nil {
		s.fleet.stop()
	}

	s.cancel()

	if s.apid != nil {
		s.apid.stop()
	}

	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if s.registry != nil {
		s.registry.Close(sctx)
	}

	if s.public != nil {
		s.public.Close(sctx)
	}

	if s.ci != nil {
		_ = s.ci.srv.Shutdown(sctx)
	}

	if s.fleet != nil && s.fleet.endpoint != nil {
		s.fleet.endpoint.close()
	}

	for _, d := range s.delays {
		d.close()
	}

	if s.cp != nil {
		s.cp.stop()
	}

	_ = os.Remove(filepath.Join(s.opts.Dir, ReadyFile))
}

// WriteKubeconfig writes a kubeconfig for a new client identity (user, groups) that reaches
// the API through the endpoint, as the sandbox's own kubeconfig does. Tests use distinct
// identities to find their requests in the audit log.
func (s *Sandbox) WriteKubeconfig(path, user string, groups ...string) error {
	kp, err := s.cp.kubeCA.client(user, groups...)
	if err != nil {
		return err
	}

	return writeKubeconfig(path, s.fleet.endpoint.url(), s.cp.kubeCA.certPEM(), kp.CrtPEM, kp.KeyPEM)
}

// WriteTokenKubeconfig writes a kubeconfig that authenticates with a bearer token (a service
// account's, from the TokenRequest API) through the API endpoint.
func (s *Sandbox) WriteTokenKubeconfig(path, token string) error {
	cfg := kubeconfig(s.fleet.endpoint.url(), s.cp.kubeCA.certPEM(), nil, nil)
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}

	return clientcmd.WriteToFile(*cfg, path)
}

// WriteServiceAccountDir writes what Kubernetes mounts into a pod for its service account —
// token, ca.crt, namespace — into dir, and returns the environment a pod gets
// (KUBERNETES_SERVICE_HOST and _PORT, here the API endpoint: the sandbox has no Service
// network).
func (s *Sandbox) WriteServiceAccountDir(dir, namespace, token string) ([]string, error) {
	for name, data := range map[string][]byte{"token": []byte(token), "ca.crt": s.cp.kubeCA.certPEM(), "namespace": []byte(namespace)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}

	u, err := url.Parse(s.fleet.endpoint.url())
	if err != nil {
		return nil, err
	}

	return []string{"KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port()}, nil
}

// AuditEvent is one write recorded in the apiserver's audit log.
type AuditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// AuditedWrites returns the write requests user made, as the apiserver's audit log records them.
// Permission checks and "who am I" (SelfSubjectAccessReview, SelfSubjectReview) are creates
// that persist nothing and are left out.
func (s *Sandbox) AuditedWrites(user string) ([]AuditEvent, error) {
	b, err := os.ReadFile(filepath.Join(s.opts.Dir, "logs", AuditLogFile))
	if err != nil {
		return nil, err
	}

	var out []AuditEvent

	// The apiserver may be writing a line right now: only complete lines are read.
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		b = nil
	}

	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}

		var ev AuditEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}

		// Permission checks and server-side dry runs persist nothing: they are no writes.
		if ev.User.Username == user && !strings.Contains(ev.RequestURI, "/selfsubject") && !dryRun(ev.RequestURI) {
			out = append(out, ev)
		}
	}

	return out, nil
}

// dryRun reports whether a request URI asks for a server-side dry run (nothing is stored).
func dryRun(uri string) bool {
	u, err := url.Parse(uri)

	return err == nil && u.Query().Get("dryRun") == "All"
}

// EncryptSecret makes a SOPS file like secret.enc.yaml holding dockerconfigjson, for the
// sandbox's age key (tests rotate to credentials of their own with it).
func (s *Sandbox) EncryptSecret(dockerconfigjson []byte) ([]byte, error) {
	return secretfile.Encrypt(dockerconfigjson, s.ageRecipient)
}

// Accessors for tests and the CLI.

func (s *Sandbox) Dir() string                  { return s.opts.Dir }
func (s *Sandbox) Path(name string) string      { return filepath.Join(s.opts.Dir, name) }
func (s *Sandbox) Options() Options             { return s.opts }
func (s *Sandbox) Fleet() *Fleet                { return s.fleet }
func (s *Sandbox) Registry() *registry.Registry { return s.registry }

// PublicRegistry is the anonymous registry beside ghcr.io's stand-in: registry.k8s.io's
// stand-in, and the operator's own registry ghcrsync's image comes from.
func (s *Sandbox) PublicRegistry() *registry.Registry { return s.public }
func (s *Sandbox) AdminRESTConfig() *rest.Config      { return rest.CopyConfig(s.cp.admin) }
func (s *Sandbox) APIServerAddr() string              { return s.cp.apiAddr }
func (s *Sandbox) EndpointURL() string                { return s.fleet.endpoint.url() }
func (s *Sandbox) TalosEndpoint() string              { return s.talosAddr }
func (s *Sandbox) CIURL() string                      { return s.ci.url() }

// ChildPIDs are the processes the sandbox started: the control plane's, each real node's
// containerd and kubelet, and real Flux's controllers.
func (s *Sandbox) ChildPIDs() []int {
	pids := s.cp.pids()

	if s.flux != nil {
		for _, p := range []*process{s.flux.source, s.flux.kustomize} {
			if p != nil {
				pids = append(pids, p.Pid())
			}
		}
	}

	for _, m := range s.fleet.Machines() {
		if m.real != nil {
			pids = append(pids, m.real.pids()...)
		}
	}

	return pids
}

// OldCredential is the credential the fleet starts on (unless InSync).
func (s *Sandbox) OldCredential() Credential {
	s.credMu.Lock()
	defer s.credMu.Unlock()

	return s.oldCred
}

// NewCredential is the credential in secret.enc.yaml.
func (s *Sandbox) NewCredential() Credential {
	s.credMu.Lock()
	defer s.credMu.Unlock()

	return s.newCred
}

// Kube is a direct admin client (bypasses the endpoint proxy).
func (s *Sandbox) Kube() kubernetes.Interface {
	k, _ := kubernetes.NewForConfig(s.cp.admin)

	return k
}
