package object

import (
	"k8s.io/apimachinery/pkg/types"
)

// Ref names the object an Event is about.
type Ref struct {
	Kind, Namespace, Name string
	UID                   types.UID
	APIVersion            string
}

// NodeRef, SecretRef and LeaseRef are the objects ghcrsync acts on.
func NodeRef(name string, uid types.UID) Ref {
	return Ref{Kind: "Node", Name: name, UID: uid, APIVersion: "v1"}
}

func SecretRef(namespace, name string) Ref {
	return Ref{Kind: "Secret", Namespace: namespace, Name: name, APIVersion: "v1"}
}

func LeaseRef(namespace, name string) Ref {
	return Ref{Kind: "Lease", Namespace: namespace, Name: name, APIVersion: "coordination.k8s.io/v1"}
}
