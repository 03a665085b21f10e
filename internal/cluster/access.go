package cluster

import (
	"context"
	"fmt"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Access is one permission a command needs: a verb on a resource (a subresource after "/"),
// in a namespace ("" = cluster-wide), on one object ("" = any).
type Access struct {
	Verb, Group, Resource, Namespace, Name string
}

func (a Access) String() string {
	s := a.Verb + " " + a.Resource
	if a.Group != "" {
		s += "." + a.Group
	}

	if a.Name != "" {
		s += " " + a.Name
	}

	if a.Namespace != "" {
		s += " in " + a.Namespace
	} else {
		s += " (cluster-wide)"
	}

	return s
}

// Denied asks the API server, with SelfSubjectAccessReviews (which persist nothing), which of
// needs this identity lacks.
func (c *Connection) Denied(ctx context.Context, needs []Access) ([]Access, error) {
	var denied []Access

	for _, a := range needs {
		resource, sub, _ := strings.Cut(a.Resource, "/")

		r, err := c.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: a.Namespace, Verb: a.Verb, Group: a.Group, Resource: resource, Subresource: sub, Name: a.Name,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, c.Unreachable("check permissions ("+a.String()+")", err)
		}

		if !r.Status.Allowed {
			denied = append(denied, a)
		}
	}

	return denied, nil
}

// Identity is the user name the API server knows ghcrsync by ("" if it cannot tell).
func (c *Connection) Identity(ctx context.Context) string {
	r, err := c.Client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return ""
	}

	return r.Status.UserInfo.Username
}

// PermissionError is a command the cluster's RBAC would stop half-way: it names what is
// missing, before anything was written.
type PermissionError struct {
	Command, Identity string
	// Grant says how the identity gets them.
	Grant  string
	Denied []Access
}

func (e *PermissionError) Error() string {
	who := e.Identity
	if who == "" {
		who = "this identity"
	}

	list := make([]string, 0, len(e.Denied))
	for _, a := range e.Denied {
		list = append(list, a.String())
	}

	return fmt.Sprintf("ghcrsync %s cannot run as %s: the cluster denies %s. Grant them (%s; docs/rbac.md), or use the identity made for %s; nothing was changed",
		e.Command, who, strings.Join(list, "; "), e.Grant, e.Command)
}
