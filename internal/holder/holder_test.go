package holder

import (
	"os"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   ID
	}{
		{"github", ID{Revision: "9f8e7d6c5b4a3928", RunRef: "gh123.1", Host: "runner", PID: 42, Nonce: "abcdef"}},
		{"run_ref_with_dashes", ID{Revision: "9f8e7d6c5b4a3928", RunRef: "deploy-2026-11-30", Host: "fv-az123-456", PID: 7, Nonce: "00ff00"}},
		{"percent_and_escape_lookalikes", ID{Revision: "r", RunRef: "50%-off %2D", Host: "h%25", PID: 1, Nonce: "n"}},
		{"empty_fields", ID{PID: 1}},
		{"unicode", ID{Revision: "r", RunRef: "déploiement—1", Host: "hôte", PID: 99, Nonce: "n"}},
		{"with_process_identity", ID{Revision: "r", RunRef: "gh1.1", Host: "h", PID: 99, Nonce: "n", Proc: "0123456789ab.4026531836.1234567"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Parse(tc.id.String())
			if !ok || got != tc.id {
				t.Fatalf("Parse(%q) = %+v, %t; want %+v", tc.id.String(), got, ok, tc.id)
			}
		})
	}
}

func TestParseRefusesForeignHolders(t *testing.T) {
	for _, s := range []string{"", "other-run", "abandoned-run-gh9.1", "a-b-c-notapid-e", "a-b-c-0-e", "a-b%2-c-1-e", "a-b-c-1-e-f", "a-b-c-1-e-0123456789ab.1", "a-b-c-1-e-0123456789AB.1.2", "a-b-c-1-e-f-g"} {
		if id, ok := Parse(s); ok {
			t.Errorf("Parse(%q) accepted: %+v", s, id)
		}
	}
}

func TestNewRecordsThisProcess(t *testing.T) {
	t.Setenv("GITHUB_RUN_ID", "77")
	t.Setenv("GITHUB_RUN_ATTEMPT", "3")

	id := New("0123456789abcdef0123", "")
	host, _ := os.Hostname()

	if id.Revision != "0123456789abcdef" || id.RunRef != "gh77.3" || id.Host != host || id.PID != os.Getpid() || len(id.Nonce) != 6 {
		t.Fatalf("%+v", id)
	}

	if _, start, ok := ProcessParts(id.Proc); !ok || start == "" {
		t.Fatalf("no process identity: %q", id.Proc)
	}

	if got, ok := Start(os.Getpid()); !ok || id.Proc != Space()+"."+got {
		t.Fatalf("process identity %q, this process %s.%s", id.Proc, Space(), got)
	}

	if New("r", "explicit-ref").RunRef != "explicit-ref" {
		t.Fatal("an explicit run ref is not kept")
	}

	t.Setenv("GITHUB_RUN_ID", "")

	if RunRef("") != "local" {
		t.Fatal("outside CI the run ref is local")
	}
}
