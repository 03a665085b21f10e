package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/ghcrsync/ghcrsync/internal/view"
)

// --log-format json stays JSON through the output guard whatever a field holds (a Lease holder,
// a node annotation, an API error): every line parses, with jq too, and gives the value back as
// it was. The negative control: hclog's JSON written straight through the guard does not parse.
func TestJSONLogIsValidUnderHostileStrings(t *testing.T) {
	const hostile = "::error::x\n##[add-mask]legacy\x7fdel\u0085c1\x1b[31m\u202e"

	var out bytes.Buffer

	logger, err := newLogger(view.Guard(&out), "debug", "json")
	if err != nil {
		t.Fatal(err)
	}

	logger.Info("lease held by "+hostile, "holder", hostile, hostile, "as a key")
	logger.Warn("plain", "node", "prod-worker-1")

	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), out.String())
	}

	for _, l := range lines {
		var entry map[string]any
		if err := json.Unmarshal([]byte(l), &entry); err != nil {
			t.Fatalf("a log line is not JSON: %v\n%s", err, l)
		}
	}

	var first map[string]any
	_ = json.Unmarshal([]byte(lines[0]), &first)

	if first["holder"] != hostile || first[hostile] != "as a key" || first["@message"] != "lease held by "+hostile {
		t.Fatalf("the values did not come back as written: %q", first)
	}

	if jq, err := exec.LookPath("jq"); err == nil {
		cmd := exec.Command(jq, "-e", "-s", "length == 2 and (.[0].holder | contains(\"##[add-mask]\"))")
		cmd.Stdin = strings.NewReader(out.String())

		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("jq does not parse the log: %v\n%s", err, b)
		}
	}

	// The control: without the JSON escaping, the guard's own escapes make it invalid.
	var raw bytes.Buffer

	hclog.New(&hclog.LoggerOptions{Output: view.Guard(&raw), JSONFormat: true}).Info("x", "holder", hostile)

	if json.Valid(bytes.TrimSpace(raw.Bytes())) {
		t.Fatalf("control: hclog's JSON through the guard parses; the test proves nothing:\n%s", raw.String())
	}
}
