package sandbox_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config"
	configconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/cri"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// withRegistryAuth returns cfg's documents re-encoded with the registry's RegistryAuthConfig
// replaced by cred: what ghcrsync's configure step sends.
func withRegistryAuth(t *testing.T, cfg config.Provider, cred sandbox.Credential) []byte {
	t.Helper()

	var docs []configconfig.Document

	for _, d := range cfg.Documents() {
		if d.Kind() != cri.RegistryAuthConfig {
			docs = append(docs, d)
		}
	}

	auth := cri.NewRegistryAuthConfigV1Alpha1(sandbox.RegistryHost)
	auth.RegistryUsername, auth.RegistryPassword = cred.Username, cred.Password
	docs = append(docs, auth)

	c, err := container.New(docs...)
	if err != nil {
		t.Fatal(err)
	}

	b, err := c.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		t.Fatal(err)
	}

	return b
}

func node(t *testing.T, kube kubernetes.Interface, name string) *corev1.Node {
	t.Helper()

	n, err := kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	return n
}

// fence cordons the node, marks it owned by a test run, and evicts its evictable pods: the
// state in which the safety witness accepts a reboot. The returned func undoes it.
func fence(t *testing.T, kube kubernetes.Interface, name string) func() {
	t.Helper()

	sandboxtest.PatchNode(t, kube, name, map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{sandbox.OwnerAnnotation: "test-" + t.Name()}},
		"spec":     map[string]any{"unschedulable": true},
	})

	ctx := context.Background()

	sandboxtest.Eventually(t, 60*time.Second, "drain "+name, func() error {
		pods, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
		if err != nil {
			return err
		}

		for i := range pods.Items {
			p := &pods.Items[i]
			if !sandbox.Evictable(p) {
				continue
			}

			if p.DeletionTimestamp == nil {
				err := kube.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
				if err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("evict %s/%s: %w", p.Namespace, p.Name, err)
				}
			}

			return fmt.Errorf("pod %s/%s still on the node", p.Namespace, p.Name)
		}

		return nil
	})

	return func() {
		sandboxtest.PatchNode(t, kube, name, map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{sandbox.OwnerAnnotation: nil}},
			"spec":     map[string]any{"unschedulable": false},
		})
	}
}

// waitRebooted waits until the node reports a boot ID other than before and is Ready.
func waitRebooted(t *testing.T, kube kubernetes.Interface, name, bootBefore string) *corev1.Node {
	t.Helper()

	var n *corev1.Node

	sandboxtest.Eventually(t, 90*time.Second, name+" back Ready with a new boot", func() error {
		var err error

		n, err = kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if n.Status.NodeInfo.BootID == bootBefore || !sandbox.NodeReady(n) {
			return fmt.Errorf("boot %s ready %t", n.Status.NodeInfo.BootID, sandbox.NodeReady(n))
		}

		return nil
	})

	return n
}

func stats(t *testing.T) sandbox.Stats { return sandboxtest.Get(t).Fleet().Stats() }

func machineIP(t *testing.T, name string) string {
	t.Helper()

	m, ok := sandboxtest.Get(t).Fleet().Machine(name)
	if !ok {
		t.Fatalf("no machine %s", name)
	}

	return m.IP
}

func onNode(ctx context.Context, t *testing.T, name string) context.Context {
	return client.WithNode(ctx, machineIP(t, name))
}

func onNodeIPOrName(ctx context.Context, target string) context.Context {
	return client.WithNode(ctx, target)
}

func yamlUnmarshal(b []byte, v any) error { return yaml.Unmarshal(b, v) }

type httpResponse struct {
	code int
	body []byte
}

func httpGet(ctx context.Context, url string) (httpResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return httpResponse{}, err
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return httpResponse{}, err
	}
	defer resp.Body.Close()

	b, err := io.ReadAll(resp.Body)

	return httpResponse{code: resp.StatusCode, body: b}, err
}
