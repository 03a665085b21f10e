package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/grpclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/ghcrsync/ghcrsync/internal/view"
)

// What the libraries print themselves — an API server's Warning header through client-go, a
// klog line, a gRPC log line — reaches the guarded stream: a hostile warning can start no
// workflow command, in either form, and carries no control character.
func TestLibraryOutputIsGuarded(t *testing.T) {
	const hostile = "::error::fake ##[add-mask]secret"

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Warning", `299 - "`+hostile+`"`)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"NamespaceList","apiVersion":"v1","items":[]}`))
	}))
	defer srv.Close()

	var b bytes.Buffer

	routeLibraryOutput(view.Guard(&b))
	t.Cleanup(func() { routeLibraryOutput(&bytes.Buffer{}) })

	kube, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}

	if _, err := kube.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}

	klog.Warning("\n::warning::from klog \x1b[2J")
	klog.Flush()
	grpclog.Error("\n##[error]from grpc")

	out := b.String()
	for _, want := range []string{"fake", "from klog", "from grpc"} {
		if !strings.Contains(out, want) {
			t.Errorf("%q did not reach the guarded stream:\n%s", want, out)
		}
	}

	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " \t"), "::") || strings.Contains(line, "##[") || strings.ContainsRune(line, 0x1b) {
			t.Errorf("unsafe line %q", line)
		}
	}
}
