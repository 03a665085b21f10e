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

func TestDockerConfig(t *testing.T) {
	if got := DockerConfig([]byte(`{}`)); got != "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" {
		t.Fatal(got)
	}
}
