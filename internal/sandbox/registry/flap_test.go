package registry

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
)

// A flapping registry answers every request with trouble until the flap ends; ghcrsync's proof
// (credential.Retry) waits it out and says what it waited out. The negative control: with a
// window shorter than the flap, the proof fails saying the registry is in trouble.
func TestAFlapIsWaitedOutByTheProof(t *testing.T) {
	reg, err := Start()
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { reg.Close(context.Background()) })
	reg.AddCredential("flap", "s3cret")

	c, err := credential.Parse(secretfile.DockerConfigJSON(RegistryHost, "flap", "s3cret"), RegistryHost)
	if err != nil {
		t.Fatal(err)
	}

	r := credential.Registry{Endpoint: reg.URL(), TrustedHosts: []string{"127.0.0.1"}}
	targets := []string{"ghcrsync/private-probe:v1"}

	if err := reg.Flap(4*time.Second, nil, time.Second, 1); err != nil {
		t.Fatal(err)
	}

	retry := credential.Retry{Window: time.Minute, Denied: 30 * time.Second}

	_, out, err := retry.Prove(context.Background(), r, c, targets, 10*time.Second, nil)
	if err != nil || out.Attempts < 2 || out.String() == "" {
		t.Fatalf("a 4 s flap: %v (%s, %d attempts; served %v)", err, out, out.Attempts, reg.Served())
	}

	t.Logf("waited out: %s; served %v", out, reg.Served())

	if err := reg.Flap(time.Minute, []string{"503"}, 0, 2); err != nil {
		t.Fatal(err)
	}

	_, _, err = credential.Retry{Window: 3 * time.Second, Denied: time.Second}.Prove(context.Background(), r, c, targets, 10*time.Second, nil)
	if err == nil || !strings.Contains(err.Error(), "the registry is in trouble") || credential.Refused(err) {
		t.Fatalf("a flap longer than the window: %v", err)
	}
}
