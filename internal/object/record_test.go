package object

import (
	"strings"
	"testing"
)

// A recovery record is accepted only with the full schema ghcrsync writes: every field, of its
// type, and nothing else.
func TestParseRecordSchema(t *testing.T) {
	const full = `{"uid":"u1","was_cordoned":true,"initial_taints":["a=b:NoSchedule"],"desired_revision":"r","scale_down_guard_ours":false}`

	for _, tc := range []struct {
		name, raw, err string
	}{
		{"full", full, ""},
		{"no taints yet", `{"uid":"u1","was_cordoned":false,"initial_taints":null,"desired_revision":"r","scale_down_guard_ours":true}`, ""},
		{"was_cordoned missing", `{"uid":"u1","initial_taints":[],"desired_revision":"r","scale_down_guard_ours":false}`, `lacks "was_cordoned"`},
		{"a field of another writer", strings.Replace(full, `"uid"`, `"extra":1,"uid"`, 1), "fields ghcrsync does not write"},
		{"wrong type", strings.Replace(full, `"was_cordoned":true`, `"was_cordoned":"yes"`, 1), "wrong type"},
		{"no uid", strings.Replace(full, `"uid":"u1"`, `"uid":""`, 1), "names no node uid"},
		{"not an object", `["uid"]`, "not the JSON object"},
		{"null", `null`, "not the JSON object"},
		{"too large", `{"uid":"` + strings.Repeat("x", 20<<10) + `"}`, "bytes, over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRecord(tc.raw)

			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want %q", err, tc.err)
			}
		})
	}
}
