package view

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// rbacTo writes the rendered roles as one YAML stream for `kubectl apply -f -`: a header that
// says what it is and how to apply it, the namespaces left out, then each object.
func rbacTo(w io.Writer, source string, skipped []string, objs []runtime.Object) error {
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

		if line, bad := guardAlters(b); bad {
			return fmt.Errorf("the rendering of %T would be changed by the output guard at %q: a rendering bug, report it", o, Clean(line))
		}

		fmt.Fprintf(w, "---\n%s", withoutEmpty(b))
	}

	return nil
}

// guardAlters reports a line of b that Guard would print otherwise (a line beginning with a
// colon, a "##["): YAML folds a long string at its spaces, so a policy's CEL expression could
// begin a line with one, and the policy applied would not be the one rendered.
func guardAlters(b []byte) (string, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " \t"), ":") || strings.Contains(line, legacyCommand) {
			return line, true
		}
	}

	return "", false
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
