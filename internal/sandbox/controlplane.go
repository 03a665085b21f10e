package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// controlPlane is a real etcd + kube-apiserver + kube-controller-manager + kube-scheduler,
// started from the binaries scripts/build-control-plane.sh builds.
type controlPlane struct {
	dir     string
	kubeCA  *authority
	apiAddr string // 127.0.0.1:port, the apiserver's own listener
	procs   []*process

	admin *rest.Config // direct to apiAddr, system:masters
}

type controlPlaneOptions struct {
	binDir      string
	dir         string
	extraSANs   []net.IP
	nodeGrace   time.Duration
	logf        func(string, ...any)
	apiserverUp func() // called once the API answers /readyz
}

func startControlPlane(ctx context.Context, o controlPlaneOptions) (_ *controlPlane, err error) {
	cp := &controlPlane{dir: o.dir}

	defer func() {
		if err != nil {
			cp.stop()
		}
	}()

	pki := filepath.Join(o.dir, "pki")
	logs := filepath.Join(o.dir, "logs")

	for _, d := range []string{pki, logs, filepath.Join(o.dir, "etcd")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}

	if cp.kubeCA, err = newAuthority("kubernetes"); err != nil {
		return nil, err
	}

	ips := append([]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")}, o.extraSANs...)

	serving, err := cp.kubeCA.serving("kube-apiserver", ips,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return nil, err
	}

	saKey, saPub, err := newSigningKey()
	if err != nil {
		return nil, err
	}

	files := map[string][]byte{
		"ca.crt":        cp.kubeCA.certPEM(),
		"apiserver.crt": serving.CrtPEM,
		"apiserver.key": serving.KeyPEM,
		"sa.key":        saKey,
		"sa.pub":        saPub,
		"audit.yaml":    []byte(auditPolicy),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(pki, name), data, 0o600); err != nil {
			return nil, err
		}
	}

	etcdClient, err := freePort("127.0.0.1")
	if err != nil {
		return nil, err
	}

	etcdPeer, err := freePort("127.0.0.1")
	if err != nil {
		return nil, err
	}

	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)

	o.logf("starting etcd on %s", etcdURL)

	etcd, err := startProcess("etcd", filepath.Join(o.binDir, "etcd"), []string{
		"--name=sandbox",
		"--data-dir=" + filepath.Join(o.dir, "etcd"),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=sandbox=" + peerURL,
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}, nil, logs)
	if err != nil {
		return nil, err
	}

	cp.procs = append(cp.procs, etcd)

	if err := waitHTTP(ctx, etcd, etcdURL+"/health", nil, 60*time.Second); err != nil {
		return nil, err
	}

	apiPortLocal, err := freePort("127.0.0.1")
	if err != nil {
		return nil, err
	}

	cp.apiAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPortLocal))
	o.logf("starting kube-apiserver on %s", cp.apiAddr)

	apiserver, err := startProcess("kube-apiserver", filepath.Join(o.binDir, "kube-apiserver"), []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(apiPortLocal),
		"--cert-dir=" + pki,
		"--tls-cert-file=" + filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(pki, "apiserver.key"),
		"--client-ca-file=" + filepath.Join(pki, "ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
		"--audit-policy-file=" + filepath.Join(pki, "audit.yaml"),
		"--audit-log-path=" + filepath.Join(logs, AuditLogFile),
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
		"--v=1",
	}, nil, logs)
	if err != nil {
		return nil, err
	}

	cp.procs = append(cp.procs, apiserver)

	admin, err := cp.kubeCA.client("sandbox-admin", "system:masters")
	if err != nil {
		return nil, err
	}

	cp.admin = &rest.Config{
		Host: "https://" + cp.apiAddr,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: cp.kubeCA.certPEM(), CertData: admin.CrtPEM, KeyData: admin.KeyPEM,
		},
		QPS: 200, Burst: 400,
	}

	httpClient, err := rest.HTTPClientFor(cp.admin)
	if err != nil {
		return nil, err
	}

	if err := waitHTTP(ctx, apiserver, cp.admin.Host+"/readyz", httpClient, 120*time.Second); err != nil {
		return nil, err
	}

	o.logf("kube-apiserver ready")

	for _, c := range []struct{ name, user string }{
		{"kube-controller-manager", "system:kube-controller-manager"},
		{"kube-scheduler", "system:kube-scheduler"},
	} {
		kp, err := cp.kubeCA.client(c.user)
		if err != nil {
			return nil, err
		}

		kubeconfig := filepath.Join(pki, c.name+".kubeconfig")
		if err := writeKubeconfig(kubeconfig, cp.admin.Host, cp.kubeCA.certPEM(), kp.CrtPEM, kp.KeyPEM); err != nil {
			return nil, err
		}

		args := []string{
			"--kubeconfig=" + kubeconfig,
			"--leader-elect=false",
			"--secure-port=0",
			"--v=1",
		}
		if c.name == "kube-controller-manager" {
			grace := o.nodeGrace
			args = append(args,
				"--use-service-account-credentials=true",
				"--service-account-private-key-file="+filepath.Join(pki, "sa.key"),
				"--root-ca-file="+filepath.Join(pki, "ca.crt"),
				"--controllers=*,-bootstrapsigner,-tokencleaner,-csrsigning,-csrapproving,-csrcleaner",
				"--node-monitor-period=1s",
				"--node-monitor-grace-period="+grace.String(),
				"--concurrent-gc-syncs=5",
			)
		}

		o.logf("starting %s", c.name)

		p, err := startProcess(c.name, filepath.Join(o.binDir, c.name), args, nil, logs)
		if err != nil {
			return nil, err
		}

		cp.procs = append(cp.procs, p)
	}

	return cp, nil
}

// AuditLogFile (under DIR/logs) is the apiserver's audit log: every write request, with the
// user who made it. Tests read it to prove that a command wrote nothing.
const AuditLogFile = "audit.log"

// auditPolicy records the writes (at Metadata level, so no object content and no secret).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
`

// waitHealthy waits until the controllers have done the work the rest of the sandbox depends
// on: the default ServiceAccount exists (without it every Pod is rejected).
func (cp *controlPlane) waitHealthy(ctx context.Context, kube kubernetes.Interface) error {
	deadline := time.Now().Add(90 * time.Second)

	for {
		if err := cp.exited(); err != nil {
			return err
		}

		if _, err := kube.CoreV1().ServiceAccounts("default").Get(ctx, "default", getOpts); err == nil {
			return nil
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: kube-controller-manager did not create the default ServiceAccount in 90s (see %s)",
				filepath.Join(cp.dir, "logs", "kube-controller-manager.log"))
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (cp *controlPlane) exited() error {
	for _, p := range cp.procs {
		if err := p.Exited(); err != nil {
			return err
		}
	}

	return nil
}

// pids lists the child processes (for leak checks).
func (cp *controlPlane) pids() []int {
	var out []int
	for _, p := range cp.procs {
		out = append(out, p.Pid())
	}

	return out
}

func (cp *controlPlane) stop() {
	// Controllers first, etcd last.
	for i := len(cp.procs) - 1; i >= 0; i-- {
		_ = cp.procs[i].Stop(10 * time.Second)
	}
}

func waitHTTP(ctx context.Context, p *process, url string, client *http.Client, timeout time.Duration) error {
	if client == nil {
		client = http.DefaultClient
	}

	deadline := time.Now().Add(timeout)

	for {
		if err := p.Exited(); err != nil {
			return err
		}

		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()

			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: %s not healthy at %s after %s", p.Name(), url, timeout)
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// writeKubeconfig writes a client-certificate kubeconfig (0600).
func writeKubeconfig(path, server string, ca, crt, key []byte) error {
	return clientcmd.WriteToFile(*kubeconfig(server, ca, crt, key), path)
}

// kubeconfigBytes renders a kubeconfig (what Talos's Kubeconfig API hands out).
func kubeconfigBytes(server string, ca, crt, key []byte) ([]byte, error) {
	return clientcmd.Write(*kubeconfig(server, ca, crt, key))
}

func kubeconfig(server string, ca, crt, key []byte) *clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["sandbox"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: crt, ClientKeyData: key}
	cfg.Contexts["sandbox"] = &clientcmdapi.Context{Cluster: "sandbox", AuthInfo: "admin"}
	cfg.CurrentContext = "sandbox"

	return cfg
}
