package kubestate

import (
	"regexp"
	"testing"

	"github.com/ghcrsync/ghcrsync/state"
)

// Every key encode writes is one KeyPattern admits (the admission policy refuses any other in
// the state Secret), and the pattern admits nothing else.
func TestKeysMatchTheirPattern(t *testing.T) {
	re := regexp.MustCompile(KeyPattern)

	data, err := encode(&state.State{})
	if err != nil {
		t.Fatal(err)
	}

	for k := range data {
		if !re.MatchString(k) {
			t.Errorf("encode writes key %q, which KeyPattern refuses", k)
		}
	}

	for _, k := range []string{"state.json.gz.17", "chunks"} {
		if !re.MatchString(k) {
			t.Errorf("%q: refused", k)
		}
	}

	for _, k := range []string{"HCLOUD_TOKEN", "chunks2", "state.json.gz.", "state.json.gz.1x", "xstate.json.gz.1", ".dockerconfigjson"} {
		if re.MatchString(k) {
			t.Errorf("%q: admitted", k)
		}
	}
}
