// Package cluster is ghcrsync's Kubernetes adapter: it reads the API into ghcrsync's snapshot
// types and makes the writes the rules decided elsewhere (plan, apply, fence) ask for — compare-
// and-swap patches of Nodes, the drain's evictions, the probe and writer pods, Events, access
// reviews and the containment canaries. The rules it applies are the API's own (a conflict is
// re-read, a lost answer is reconciled), never which node or secret to act on.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/requests"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Connection is a Kubernetes client and the API endpoint host it talks to.
type Connection struct {
	Client   kubernetes.Interface
	Config   *rest.Config
	Server   string // the kubeconfig's server URL
	Endpoint string // its host
	// Requests counts the requests made through Client (and any client built from Config).
	Requests *requests.Counter

	// events writes Events with its own client-side rate limit: the audit trail never queues
	// a node's next step behind it.
	events kubernetes.Interface
	// probeNamespaces are the runtime probe namespaces already seen to exist; probeNamespaceMu
	// makes the proofs that start together ask once.
	probeNamespaces  sync.Map
	probeNamespaceMu sync.Mutex
	// Clock is this machine's clock (clock.System unless a test hands in another); server is
	// the API server's, read off its answers.
	Clock  clock.Clock
	server *serverClock
}

// FieldManager is ghcrsync's name in the objects' managedFields (the client's user agent, which
// the API server takes as the manager of every write without one): any other manager of an
// object ghcrsync writes is another owner (plan.OtherOwners).
const FieldManager = "ghcrsync"

// Connect builds a client from a kubeconfig (path "" follows KUBECONFIG and ~/.kube/config)
// and context ("" = current), every request bounded by timeout (0: 30 s). It does not contact
// the cluster.
func Connect(kubeconfig, context string, timeout time.Duration) (*Connection, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}

	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context})

	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w (set cluster.kubeconfig in the configuration, or KUBECONFIG)", describePath(kubeconfig), err)
	}

	return connect(cfg, timeout)
}

// ConnectInCluster connects as the pod's service account, as a pod does: the API at
// KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT, verified with dir/ca.crt, authenticated
// with dir/token (re-read as the kubelet rotates it).
func ConnectInCluster(dir string, timeout time.Duration) (*Connection, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("cluster.in_cluster is set, but KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not: " +
			"run ghcrsync in a pod, or use cluster.kubeconfig outside the cluster")
	}

	token, ca := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	for _, f := range []string{token, ca} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("cluster.in_cluster: the service account's %s is missing (%v): mount the service account token "+
				"(automountServiceAccountToken), or set cluster.service_account_dir", filepath.Base(f), err)
		}
	}

	cfg := &rest.Config{
		Host:            "https://" + net.JoinHostPort(host, port),
		BearerTokenFile: token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
	}

	return connect(cfg, timeout)
}

func connect(cfg *rest.Config, timeout time.Duration) (*Connection, error) {
	counter, server := &requests.Counter{}, &serverClock{}
	cfg.Wrap(counter.Transport)
	cfg.Wrap(server.wrap)
	cfg.UserAgent = FieldManager
	// client-go's default (5 QPS, burst 10) queues a run's requests behind each other: the read
	// and the compare-and-swap patch of a claim end up ~0.5 s apart, and every kubelet
	// heartbeat in between is a conflict. kubectl's limits.
	cfg.QPS, cfg.Burst = 50, 300

	cfg.Timeout = timeout
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}

	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig server %q is not a URL: %w", cfg.Host, err)
	}

	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}

	events, err := kubernetes.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		return nil, err
	}

	host := u.Hostname()
	if h, _, err := net.SplitHostPort(u.Host); err == nil {
		host = h
	}

	return &Connection{Client: client, Config: cfg, Server: cfg.Host, Endpoint: host, Requests: counter, events: events, Clock: clock.System, server: server}, nil
}

// Dynamic is a client for the resources client-go has no types for (Flux's), on the connection's
// configuration as it is now (with any transport Wrap put around it).
func (c *Connection) Dynamic() (dynamic.Interface, error) { return dynamic.NewForConfig(c.Config) }

// LeaseClient is a client of its own for the run Lease: its own client-side rate limit, so a
// renewal never queues behind a drain's evictions or a fan-out's writes.
func (c *Connection) LeaseClient() (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst, cfg.RateLimiter = 10, 20, nil

	return kubernetes.NewForConfig(cfg)
}

// watchClient is a client for the run's watches: no overall request timeout (a watch is bounded
// by the API server's own timeout and its context; the connection's 30 s would cut it every
// 30 s, each cut a klog warning on stderr), and a rate limit of its own (a relist never queues
// behind the run's writes, nor they behind it). Its requests are counted with the rest.
func (c *Connection) watchClient() (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(c.Config)
	cfg.Timeout = 0
	cfg.QPS, cfg.Burst, cfg.RateLimiter = 10, 20, nil

	return kubernetes.NewForConfig(cfg)
}

// Wrap puts wrap around the transport of the connection's clients (a test's faults): they are
// built again with it.
func (c *Connection) Wrap(wrap func(http.RoundTripper) http.RoundTripper) error {
	c.Config.Wrap(wrap)

	client, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}

	events, err := kubernetes.NewForConfig(rest.CopyConfig(c.Config))
	if err != nil {
		return err
	}

	c.Client, c.events = client, events

	return nil
}

func describePath(p string) string {
	if p == "" {
		return "(default loading rules)"
	}

	return p
}

// Unreachable wraps an error talking to the API with where and what to check.
func (c *Connection) Unreachable(what string, err error) error {
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		return fmt.Errorf("%s: the Kubernetes API at %s refused ghcrsync's identity: %w (check the kubeconfig user and its RBAC)", what, c.Server, err)
	}

	return fmt.Errorf("%s: cannot reach the Kubernetes API at %s: %w (check the kubeconfig's server and that the cluster is up)", what, c.Server, err)
}

// ClusterUID identifies the cluster the kubeconfig reaches: the uid of its kube-system
// namespace (created once, with the cluster). Plans are bound to it.
func (c *Connection) ClusterUID(ctx context.Context) (string, error) {
	ns, err := c.Client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return "", c.Unreachable("read namespace kube-system (the cluster's identity)", err)
	}

	return string(ns.UID), nil
}

// Nodes lists the fleet — the Nodes the label selector matches — and the identity of every
// other Node: one LIST of all Nodes with the selector matched here, so an address or uid the
// fleet shares with a Node outside it is seen.
func (c *Connection) Nodes(ctx context.Context, selector string) (fleet, outside []plan.Node, err error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, nil, fmt.Errorf("nodes.selector %q: %w; fix it in the configuration", selector, err)
	}

	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, c.Unreachable("list nodes", err)
	}

	if err := Whole("list nodes", list.ListMeta); err != nil {
		return nil, nil, err
	}

	fleet = make([]plan.Node, 0, len(list.Items))

	for i := range list.Items {
		n := object.FromNode(&list.Items[i])
		if sel.Matches(labels.Set(list.Items[i].Labels)) {
			fleet = append(fleet, n)
		} else {
			outside = append(outside, n)
		}
	}

	return fleet, outside, nil
}

// Whole refuses a list answer that is not the whole collection (a continue token, a count of
// items left: the rest was never sent): what is judged from a list — no fence, no node left on
// the old credential — must be judged from all of it.
func Whole(what string, meta metav1.ListMeta) error {
	if meta.Continue != "" || meta.RemainingItemCount != nil {
		return fmt.Errorf("%s: the API answered with part of the list only; nothing is judged from it: try again", what)
	}

	return nil
}

// Lease reads the run Lease; absent is nil.
func (c *Connection) Lease(ctx context.Context, namespace, name string) (*plan.Lease, error) {
	l, err := c.Client.CoordinationV1().Leases(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}

	if err != nil {
		return nil, c.Unreachable("read lease "+namespace+"/"+name, err)
	}

	return FromLease(l), nil
}

// FromLease converts a Lease to the snapshot type.
func FromLease(l *coordinationv1.Lease) *plan.Lease {
	out := &plan.Lease{Namespace: l.Namespace, Name: l.Name}

	if l.Spec.HolderIdentity != nil {
		out.Holder = *l.Spec.HolderIdentity
	}

	if l.Spec.RenewTime != nil {
		t := l.Spec.RenewTime.UTC()
		out.RenewTime = &t
	}

	if l.Spec.LeaseDurationSeconds != nil {
		out.DurationSeconds = int(*l.Spec.LeaseDurationSeconds)
	}

	if l.Spec.LeaseTransitions != nil {
		out.Transitions = int(*l.Spec.LeaseTransitions)
	}

	// The server's own time of the Lease's latest change (a renewal changes renewTime): its
	// managed fields' time, which the API server sets.
	for _, m := range l.ManagedFields {
		if m.Time != nil && (out.Written == nil || m.Time.After(*out.Written)) {
			t := m.Time.UTC()
			out.Written = &t
		}
	}

	return out
}
