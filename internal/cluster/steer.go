package cluster

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Destinations are every Node of the cluster as an evicted pod's scheduler sees it (the whole
// list, or an error).
func (c *Connection) Destinations(ctx context.Context) ([]plan.Destination, error) {
	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}

	if err := Whole("list nodes", list.ListMeta); err != nil {
		return nil, err
	}

	out := make([]plan.Destination, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, plan.DestinationOf(object.FromNode(&list.Items[i])))
	}

	return out, nil
}
