package sandbox

import (
	"errors"
	"net"
	"sync"
	"time"
)

// delayLine is a TCP proxy that delivers every byte half a round-trip late in each direction:
// the latency a WAN adds between a CI runner and a cluster's endpoints (--talos-latency,
// --api-latency). Throughput is not limited; only time of arrival moves.
type delayLine struct {
	l      net.Listener
	target string
	oneWay time.Duration

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// startDelayLine listens on loopback and forwards to target with rtt added to each round-trip.
func startDelayLine(target string, rtt time.Duration) (*delayLine, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}

	d := &delayLine{l: l, target: target, oneWay: rtt / 2, conns: map[net.Conn]bool{}}

	d.wg.Add(1)

	go d.serve()

	return d, nil
}

func (d *delayLine) addr() string { return d.l.Addr().String() }

// close stops accepting, cuts every connection, and waits for the pumps.
func (d *delayLine) close() {
	_ = d.l.Close()

	d.mu.Lock()
	for c := range d.conns {
		_ = c.Close()
	}
	d.mu.Unlock()

	d.wg.Wait()
}

func (d *delayLine) track(c net.Conn, on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()

	if on {
		d.conns[c] = true
	} else {
		delete(d.conns, c)
	}
}

func (d *delayLine) serve() {
	defer d.wg.Done()

	for {
		c, err := d.l.Accept()
		if err != nil {
			return
		}

		up, err := net.Dial("tcp", d.target)
		if err != nil {
			_ = c.Close()

			continue
		}

		d.track(c, true)
		d.track(up, true)
		d.wg.Add(2)

		go d.pump(up, c)
		go d.pump(c, up)
	}
}

// pump copies src to dst, each chunk written oneWay after it was read; at the end of either
// side both connections close.
func (d *delayLine) pump(dst, src net.Conn) {
	defer d.wg.Done()

	type chunk struct {
		due  time.Time
		data []byte
	}

	queue := make(chan chunk, 4096)

	go func() {
		defer close(queue)

		for {
			buf := make([]byte, 32<<10)

			n, err := src.Read(buf)
			if n > 0 {
				queue <- chunk{time.Now().Add(d.oneWay), buf[:n]}
			}

			if err != nil {
				return
			}
		}
	}()

	for c := range queue {
		time.Sleep(time.Until(c.due))

		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}

	for _, c := range []net.Conn{dst, src} {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			_ = err
		}

		d.track(c, false)
	}

	for range queue { //nolint:revive // drain the reader so it can exit
	}
}
