package holder

import "testing"

// Parse never panics, and whatever it accepts survives a round trip.
func FuzzParse(f *testing.F) {
	f.Add(ID{Revision: "0123456789abcdef", RunRef: "gh123.1", Host: "runner-1", PID: 42, Nonce: "abcdef"}.String())
	f.Add("0123456789abcdef-local-host%2Dname-1-00ff00")
	f.Add("a-b-c-d-e")
	f.Add("%zz-----")

	f.Fuzz(func(t *testing.T, s string) {
		id, ok := Parse(s)
		if !ok {
			return
		}

		again, ok := Parse(id.String())
		if !ok || again != id {
			t.Fatalf("Parse(%q) = %+v, but its String %q parses to %+v, %t", s, id, id.String(), again, ok)
		}
	})
}
