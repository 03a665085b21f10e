package authdigest

import (
	"encoding/base64"
	"testing"
)

func TestForms(t *testing.T) {
	a := Of("u", "p")
	if len(a) != 64 || a == Of("u", "q") || Of("", "") != "" {
		t.Fatal("digest")
	}

	if FromFields("", "", base64.StdEncoding.EncodeToString([]byte("u:p"))) != a || FromFields("u", "p", "") != a {
		t.Fatal("the two forms disagree")
	}
}
