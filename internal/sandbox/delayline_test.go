package sandbox

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"
)

// The delay line carries bytes intact both ways and closes both sides together; every
// round-trip through it takes at least the configured rtt (a lower bound: a slow machine only
// makes it longer).
func TestDelayLine(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()

	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}

			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()

	const rtt = 40 * time.Millisecond

	d, err := startDelayLine(echo.Addr().String(), rtt)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()

	c, err := net.Dial("tcp", d.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	payload := make([]byte, 1<<20)
	_, _ = rand.Read(payload)

	start := time.Now()

	go func() { _, _ = c.Write(payload) }()

	got := make([]byte, len(payload))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}

	if took := time.Since(start); took < rtt {
		t.Fatalf("a round-trip took %s, less than the delay line's %s", took, rtt)
	}

	if !bytes.Equal(got, payload) {
		t.Fatal("the bytes changed on the way")
	}

	_ = c.(*net.TCPConn).CloseWrite()

	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the client closed, the far side did not close: %v", err)
	}
}
