package sandbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
)

// The machine template the sandbox autoscaler boots new machines from, kept as the Hetzner
// cluster autoscaler keeps it: a Secret whose key HCLOUD_CLUSTER_CONFIG is base64 of JSON with
// nodeConfigs.<pool>.cloudInit = the Talos worker config handed to a new server as user data.
const (
	TemplateNamespace = "kube-system"
	TemplateSecret    = "hcloud-cluster-config"
	TemplateKey       = "HCLOUD_CLUSTER_CONFIG"
	TemplatePool      = "autoscale-cx43"
)

type hcloudClusterConfig struct {
	ImagesForArch map[string]string           `json:"imagesForArch"`
	NodeConfigs   map[string]hcloudNodeConfig `json:"nodeConfigs"`
}

type hcloudNodeConfig struct {
	CloudInit string            `json:"cloudInit"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// writeTemplate creates (or replaces) the template Secret with a worker config carrying cred.
func (f *Fleet) writeTemplate(ctx context.Context, cred Credential) error {
	tag, err := talosTagFor(f.opts.TalosVersion, 0)
	if err != nil {
		return err
	}

	// No hostname: on Hetzner a new server's Talos takes it from the platform metadata.
	cfg, err := renderMachineConfig(string(RoleWorker), "", tag, f.endpoint.url(), machineCAs{talos: f.talosCA, kube: f.cp.kubeCA}, cred, "")
	if err != nil {
		return err
	}

	js, err := json.Marshal(hcloudClusterConfig{
		ImagesForArch: map[string]string{"amd64": "talos-" + tag},
		NodeConfigs:   map[string]hcloudNodeConfig{TemplatePool: {CloudInit: string(cfg), Labels: map[string]string{NodeGroupLabel: TemplatePool}}},
	})
	if err != nil {
		return err
	}

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: TemplateSecret, Namespace: TemplateNamespace},
		Data:       map[string][]byte{TemplateKey: []byte(base64.StdEncoding.EncodeToString(js))},
	}

	secrets := f.admin.CoreV1().Secrets(TemplateNamespace)

	_, err = secrets.Create(ctx, secret, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = secrets.Update(ctx, secret, metav1.UpdateOptions{})
	}

	return err
}

// templateConfig is what the autoscaler hands a new server right now: it reads the Secret at
// every scale-up, decodes the pool's cloudInit, and checks that Talos would boot it.
func (f *Fleet) templateConfig(ctx context.Context) ([]byte, error) {
	s, err := f.admin.CoreV1().Secrets(TemplateNamespace).Get(ctx, TemplateSecret, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read template Secret %s/%s: %w", TemplateNamespace, TemplateSecret, err)
	}

	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(s.Data[TemplateKey])))
	if err != nil {
		return nil, fmt.Errorf("template %s is not base64: %w", TemplateKey, err)
	}

	var cc hcloudClusterConfig
	if err := json.Unmarshal(raw, &cc); err != nil {
		return nil, fmt.Errorf("template %s is not the cluster config's JSON: %w", TemplateKey, err)
	}

	cfg := cc.NodeConfigs[TemplatePool].CloudInit
	if cfg == "" {
		return nil, errors.New("template has no nodeConfigs." + TemplatePool + ".cloudInit")
	}

	if err := bootable([]byte(cfg)); err != nil {
		return nil, fmt.Errorf("the template's config: %w", err)
	}

	return []byte(cfg), nil
}

// bootable is whether a new machine would boot user data: Talos's loader and its validation
// for an installed metal machine.
func bootable(userData []byte) error {
	provider, err := configloader.NewFromBytes(userData)
	if err != nil {
		return fmt.Errorf("it does not load: %w", err)
	}

	if _, err := provider.Validate(metalInstalled{}); err != nil {
		return fmt.Errorf("a machine would not boot it: %w", err)
	}

	return nil
}
