package cluster

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/ghcrsync/ghcrsync/internal/readlimit"
	"github.com/ghcrsync/ghcrsync/plan"
)

// The cluster-autoscaler publishes its own view of every node group (--write-status-configmap,
// on by default): how many machines the cloud provider is asked for (cloudProviderTarget) and
// how many have registered as Nodes. The difference is machines being provisioned: created from
// the node template as the autoscaler read it, not Nodes yet, invisible to a Node listing.
const (
	AutoscalerStatusNamespace = "kube-system"
	AutoscalerStatusName      = "cluster-autoscaler-status"
)

// autoscalerStatus is the part of the status (the cluster-autoscaler's clusterstate/api types)
// the provisioning rule reads.
type autoscalerStatus struct {
	Time       string `json:"time"`
	NodeGroups []struct {
		Name   string `json:"name"`
		Health struct {
			NodeCounts struct {
				Registered struct {
					Total int `json:"total"`
				} `json:"registered"`
				Unregistered     int `json:"unregistered"`
				LongUnregistered int `json:"longUnregistered"`
			} `json:"nodeCounts"`
			CloudProviderTarget int `json:"cloudProviderTarget"`
		} `json:"health"`
	} `json:"nodeGroups"`
}

// Provisioning reads the autoscaler's status: each node group's target and registered machines.
// nil when the autoscaler publishes none (no cluster-autoscaler, or its status is turned off).
func (c *Connection) Provisioning(ctx context.Context) (*plan.AutoscalerObs, error) {
	cm, err := c.Client.CoreV1().ConfigMaps(AutoscalerStatusNamespace).Get(ctx, AutoscalerStatusName, metav1.GetOptions{})

	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, c.Unreachable("read the cluster-autoscaler's status "+AutoscalerStatusNamespace+"/"+AutoscalerStatusName, err)
	}

	return ParseAutoscalerStatus(cm.Data["status"])
}

// ParseAutoscalerStatus reads the status YAML the cluster-autoscaler writes.
func ParseAutoscalerStatus(text string) (*plan.AutoscalerObs, error) {
	if len(text) > readlimit.Body {
		return nil, fmt.Errorf("the cluster-autoscaler's status is %d bytes, over %d", len(text), readlimit.Body)
	}

	var st autoscalerStatus
	if err := yaml.Unmarshal([]byte(text), &st); err != nil {
		return nil, fmt.Errorf("the cluster-autoscaler's status %s/%s is not the YAML it writes: %w", AutoscalerStatusNamespace, AutoscalerStatusName, err)
	}

	obs := &plan.AutoscalerObs{Time: st.Time}

	for _, g := range st.NodeGroups {
		nc := g.Health.NodeCounts
		obs.Groups = append(obs.Groups, plan.NodeGroupObs{Name: g.Name, Target: g.Health.CloudProviderTarget, Registered: nc.Registered.Total,
			Unregistered: nc.Unregistered + nc.LongUnregistered})
	}

	return obs, nil
}
