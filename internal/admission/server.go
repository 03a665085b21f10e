package admission

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// Server serves the Handler over TLS on Addr, at /validate, with /healthz for the probes.
type Server struct {
	Addr              string
	CertFile, KeyFile string
	Handler           http.Handler
}

// Serve listens, calls listening with the address it got (a port 0 is chosen then), and serves
// until ctx ends; then it stops taking requests and lets those in flight finish (10 s at most).
func (s Server) Serve(ctx context.Context, listening func(addr string)) error {
	certs := &certificate{cert: s.CertFile, key: s.KeyFile}
	if _, err := certs.get(nil); err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/validate", s.Handler)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })

	srv := &http.Server{
		Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second, WriteTimeout: 15 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.get},
	}

	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.Addr, err)
	}

	if listening != nil {
		listening(ln.Addr().String())
	}

	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()

	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}

	stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if err := srv.Shutdown(stop); err != nil {
		return err
	}

	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}

	return nil
}

// certificate is the serving key pair, read again when its files change (cert-manager renews
// it in place): a renewal needs no restart.
type certificate struct {
	cert, key string

	mu      sync.Mutex
	current *tls.Certificate
	mtime   time.Time
}

func (c *certificate) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()

	st, err := os.Stat(c.cert)
	if err != nil {
		return nil, fmt.Errorf("the serving certificate %s: %w", c.cert, err)
	}

	if c.current != nil && st.ModTime().Equal(c.mtime) {
		return c.current, nil
	}

	pair, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		if c.current != nil { // half-renewed: keep serving the last good pair
			return c.current, nil
		}

		return nil, fmt.Errorf("the serving key pair (%s, %s): %w", c.cert, c.key, err)
	}

	c.current, c.mtime = &pair, st.ModTime()

	return c.current, nil
}
