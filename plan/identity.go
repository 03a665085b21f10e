package plan

import (
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// ghcrsync tells a node apart by its UID and reaches its Talos API at its primary (first)
// InternalIP. A Node record that does not name one machine — no UID, no InternalIP, one that is
// not an address, two of one family (a dual-stack node has one IPv4 and one IPv6 address, which
// is fine), or a UID or an InternalIP another Node reports too — could have ghcrsync configure and reboot a machine other
// than the one it drained, or count one machine twice: such a node is left alone, and the
// verdict counts what it uses as unknown.

// recordProblem is what keeps the node's own record from naming one machine ("" if nothing).
func recordProblem(n *Node) string {
	switch {
	case n.UID == "":
		return "the Node has no uid"
	case len(n.InternalIPs) == 0:
		return "the Node reports no InternalIP, so which machine's Talos API is its cannot be known"
	}

	families := map[bool]bool{}

	for _, ip := range n.InternalIPs {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return "the Node reports InternalIP " + quote(ip) + ", which is not an IP address"
		}

		if families[a.Is4()] {
			return "the Node reports several InternalIPs of one family (" + strings.Join(n.InternalIPs, ", ") +
				"), so which machine's Talos API is its cannot be known"
		}

		families[a.Is4()] = true
	}

	return ""
}

// quote bounds hostile data in a message.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}

	return strconv.Quote(s)
}

// IdentityProblems are, by node name, the snapshot's nodes that do not name one machine: their
// own record's problem, or the UID or InternalIP they share with another Node (of the fleet, or
// one its selector leaves out).
func IdentityProblems(s Snapshot) map[string]string {
	byUID, byIP := map[string][]string{}, map[string][]string{}
	index := func(id Identity) {
		if id.UID != "" {
			byUID[id.UID] = append(byUID[id.UID], id.Name)
		}

		for _, ip := range id.InternalIPs {
			byIP[ip] = append(byIP[ip], id.Name)
		}
	}

	for _, n := range s.Nodes {
		index(n.Identity())
	}

	for _, id := range s.OtherNodes {
		index(id)
	}

	out := map[string]string{}

	for _, n := range s.Nodes {
		if p := recordProblem(&n); p != "" {
			out[n.Name] = p

			continue
		}

		if others := without(byUID[n.UID], n.Name); len(others) > 0 {
			out[n.Name] = "its uid " + n.UID + " is also reported by " + strings.Join(others, ", ")

			continue
		}

		for _, ip := range n.InternalIPs {
			if others := without(byIP[ip], n.Name); len(others) > 0 {
				out[n.Name] = "its InternalIP " + ip + " is also reported by " + strings.Join(others, ", ") +
					", so the machine answering there may be another"

				break
			}
		}
	}

	return out
}

// without is names less name, sorted.
func without(names []string, name string) []string {
	var out []string

	for _, n := range names {
		if n != name {
			out = append(out, n)
		}
	}

	sort.Strings(out)

	return out
}
