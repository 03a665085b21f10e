package view

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// RBAC writes the rendered roles as one YAML stream for `kubectl apply -f -`: a header that
// says what it is and how to apply it, the namespaces left out, then each object.
func RBAC(w io.Writer, source string, skipped []string, objs []runtime.Object) error {
	fmt.Fprintf(w, "# ghcrsync's RBAC for %s, rendered by `ghcrsync rbac`: each command class's service account\n", Clean(source))
	fmt.Fprintln(w, "# with exactly the permissions its preflight checks, and the admission policy bounding the Secrets")
	fmt.Fprintln(w, "# they may write. Review it, then: kubectl apply -f deploy/rbac/namespace.yaml -f THIS_FILE")
	fmt.Fprintln(w, "# A new consumer namespace needs a new rendering (docs/rbac.md).")

	for _, ns := range skipped {
		fmt.Fprintf(w, "# Left out: namespace %s does not exist yet; render again once it does.\n", Clean(ns))
	}

	for _, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return err
		}

		fmt.Fprintf(w, "---\n%s", withoutEmpty(b))
	}

	return nil
}

// withoutEmpty drops the fields an object that was never stored marshals with no value.
func withoutEmpty(b []byte) []byte {
	var out bytes.Buffer

	for _, line := range strings.SplitAfter(string(b), "\n") {
		switch strings.TrimSpace(line) {
		case "creationTimestamp: null", "status: {}":
			continue
		}

		out.WriteString(line)
	}

	return out.Bytes()
}
