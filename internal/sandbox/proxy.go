package sandbox

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// endpointProxy is the Kubernetes API endpoint the kubeconfig names. Without --vip it is owned
// by one control-plane machine (the "endpoint node"): while that machine reboots the address
// refuses connections and open connections are cut, as when a run reboots the node its own
// kubeconfig points at. With --vip it is a virtual IP that fails over across control planes
// and is down only while none is up.
type endpointProxy struct {
	host   string // listen address (endpoint node's IP, or the VIP)
	target string // the apiserver
	owner  string // endpoint node ("" with --vip)
	fleet  *Fleet

	mu    sync.Mutex
	l     net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
	// loseUntil: until then, a connection that carries a request is cut as its answer starts
	// to come back — the server did the work, the client never hears (a lost answer).
	loseUntil time.Time
}

// loseAnswers cuts, for d, every answer as it starts to come back.
func (p *endpointProxy) loseAnswers(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()

	p.loseUntil = time.Now().Add(d)
}

func (p *endpointProxy) losing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()

	return time.Now().Before(p.loseUntil)
}

func (p *endpointProxy) addr() string { return net.JoinHostPort(p.host, strconv.Itoa(apiPort)) }
func (p *endpointProxy) url() string  { return "https://" + p.addr() }

func (p *endpointProxy) open() error {
	p.mu.Lock()
	defer p.mu.Unlock()

	if p.l != nil {
		return nil
	}

	l, err := net.Listen("tcp", p.addr())
	if err != nil {
		return err
	}

	p.l = l
	if p.conns == nil {
		p.conns = map[net.Conn]struct{}{}
	}

	p.wg.Add(1)

	go p.serve(l)

	return nil
}

func (p *endpointProxy) serve(l net.Listener) {
	defer p.wg.Done()

	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}

			continue
		}

		go p.forward(c)
	}
}

func (p *endpointProxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()

		return
	}

	p.mu.Lock()
	if p.l == nil { // went down meanwhile
		p.mu.Unlock()
		c.Close()
		up.Close()

		return
	}

	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()

	done := make(chan struct{}, 2)

	var asked atomic.Bool // the client sent something the server has not answered yet

	pipe := func(dst, src net.Conn, fromClient bool) {
		buf := make([]byte, 32<<10)

		for {
			n, err := src.Read(buf)
			if n > 0 {
				switch {
				case fromClient:
					asked.Store(true)
				case asked.Swap(false) && p.losing():
					p.fleet.statsMu.Lock()
					p.fleet.stats.LostAnswers++
					p.fleet.statsMu.Unlock()
					done <- struct{}{}

					return // the answer is dropped with the connection
				}

				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}

			if err != nil {
				break
			}
		}

		done <- struct{}{}
	}

	go pipe(up, c, true)
	go pipe(c, up, false)
	<-done
	c.Close()
	up.Close()

	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// close stops listening and cuts every open connection: connections are refused until open.
func (p *endpointProxy) close() {
	p.mu.Lock()
	l := p.l
	p.l = nil

	for c := range p.conns {
		c.Close()
	}

	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()

	if l != nil {
		l.Close()
	}

	p.wg.Wait()
}

// outage takes the endpoint down for d (refused connections, open ones cut), as a network
// partition between ghcrsync and the API would, with no machine rebooting.
func (p *endpointProxy) outage(d time.Duration) {
	p.fleet.log.Info("API endpoint outage", "endpoint", p.addr(), "for", d)
	p.close()

	p.fleet.statsMu.Lock()
	p.fleet.stats.EndpointOutages++
	p.fleet.statsMu.Unlock()

	time.AfterFunc(d, func() {
		if owner, ok := p.fleet.Machine(p.owner); p.owner != "" && (!ok || owner.BootID() == "") {
			return // its node is down: it comes back with it
		}

		if err := p.open(); err != nil {
			p.fleet.log.Error("API endpoint did not come back after the outage", "endpoint", p.addr(), "error", err)
		}
	})
}

func (p *endpointProxy) machineDown(m *Machine) {
	if m.Role != RoleControlPlane {
		return
	}

	if p.owner == m.Name || (p.owner == "" && p.fleet.controlPlanesUp() == 0) {
		p.fleet.log.Info("API endpoint down", "endpoint", p.addr(), "node", m.Name)
		p.close()

		p.fleet.statsMu.Lock()
		p.fleet.stats.EndpointOutages++
		p.fleet.statsMu.Unlock()
	}
}

func (p *endpointProxy) machineUp(m *Machine) {
	if m.Role != RoleControlPlane || (p.owner != "" && p.owner != m.Name) {
		return
	}

	if err := p.open(); err != nil {
		p.fleet.log.Error("API endpoint did not come back", "endpoint", p.addr(), "error", err)

		return
	}

	p.fleet.log.Info("API endpoint up", "endpoint", p.addr())
}
