package sandbox

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// freePort returns a TCP port on host that is free right now.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()

	return l.Addr().(*net.TCPAddr).Port, nil
}

// subnet is the sandbox's private /24 inside 127.0.0.0/8. Each sandbox picks its own so that
// concurrent sandboxes (one per test package) never share node addresses or the API port.
type subnet struct{ a, b byte }

func pickSubnet(rng *rand.Rand) (subnet, error) {
	for range 64 {
		s := subnet{a: byte(1 + rng.IntN(250)), b: byte(rng.IntN(256))}
		// The VIP and the first control-plane address must have 6443 free.
		ok := true

		for _, host := range []string{s.vip(), s.host(0)} {
			l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(apiPort)))
			if err != nil {
				ok = false

				break
			}

			l.Close()
		}

		if ok {
			return s, nil
		}
	}

	return subnet{}, fmt.Errorf("sandbox: no free 127.x.y.0/24 with port %d available", apiPort)
}

// vip is the address of the --vip API endpoint.
func (s subnet) vip() string { return fmt.Sprintf("127.%d.%d.2", s.a, s.b) }

// hostsPerOctet is how many machines one /24 holds (.10 to .249); the next ones go on in the
// following /24s (127.a.b+1.10, …), so a fleet of 1,000 has 1,000 addresses. (Until 2026-12 the
// address of the 247th machine on was not an IP address at all, 127.a.b.256, and plan left
// those nodes alone: fleets over 245 machines measured a quarter of their nodes.)
const hostsPerOctet = 240

// host is the i-th machine's address.
func (s subnet) host(i int) string {
	return fmt.Sprintf("127.%d.%d.%d", s.a, (int(s.b)+i/hostsPerOctet)%256, 10+i%hostsPerOctet)
}

// apiPort is the Kubernetes API port served on the endpoint address, as on a real cluster.
const apiPort = 6443
