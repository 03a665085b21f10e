package sandbox

import (
	"net"
	"testing"
)

// Every machine of a large fleet has an address of its own, a valid one: the 247th machine's
// used to be 127.a.b.256, which plan rightly refused to name a machine.
func TestHostAddressesOfALargeFleet(t *testing.T) {
	for _, s := range []subnet{{a: 201, b: 24}, {a: 9, b: 255}} {
		seen := map[string]int{}

		for i := range 2000 {
			h := s.host(i)

			ip := net.ParseIP(h)
			if ip == nil || !ip.IsLoopback() {
				t.Fatalf("subnet %v: machine %d has address %q, not a loopback IP", s, i, h)
			}

			if j, dup := seen[h]; dup {
				t.Fatalf("subnet %v: machines %d and %d share %s", s, j, i, h)
			}

			if ip.To4()[3] < 10 || h == s.vip() {
				t.Fatalf("subnet %v: machine %d's %s is below .10, where the VIP lives", s, i, h)
			}

			seen[h] = i
		}
	}

	if got := (subnet{a: 201, b: 24}).host(0); got != "127.201.24.10" {
		t.Fatalf("the first machine's address moved: %s", got)
	}
}
