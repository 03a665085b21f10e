package sandbox

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	stdx509 "crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/siderolabs/crypto/x509"
)

// authority is a certificate authority that issues the sandbox's serving and client
// certificates. The Kubernetes control plane and the simulated Talos API each get one.
type authority struct {
	ca *x509.CertificateAuthority
}

func newAuthority(name string) (*authority, error) {
	ca, err := x509.NewSelfSignedCertificateAuthority(
		x509.Organization(name),
		x509.ECDSA(true),
		x509.NotAfter(time.Now().Add(7*24*time.Hour)),
	)
	if err != nil {
		return nil, fmt.Errorf("sandbox: create %s CA: %w", name, err)
	}

	return &authority{ca: ca}, nil
}

// certPEM is the CA certificate in PEM form.
func (a *authority) certPEM() []byte { return a.ca.CrtPEM }

// serving issues a server certificate for the given addresses and names.
func (a *authority) serving(cn string, ips []net.IP, dns []string) (*x509.KeyPair, error) {
	return x509.NewKeyPair(a.ca,
		x509.CommonName(cn),
		x509.IPAddresses(ips),
		x509.DNSNames(dns),
		x509.ECDSA(true),
		x509.NotAfter(time.Now().Add(7*24*time.Hour)),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}),
	)
}

// client issues a client certificate; Kubernetes reads cn as the user and orgs as groups,
// Talos reads orgs as roles (os:admin, os:reader).
func (a *authority) client(cn string, orgs ...string) (*x509.KeyPair, error) {
	return x509.NewKeyPair(a.ca,
		x509.CommonName(cn),
		x509.Organization(orgs...),
		x509.ECDSA(true),
		x509.NotAfter(time.Now().Add(7*24*time.Hour)),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}),
	)
}

// WriteServingPair writes into dir a CA of its own (ca.crt) and a serving key pair it issued for
// ips (tls.crt, tls.key): what a test server the API server calls (a webhook) serves with.
func WriteServingPair(dir string, ips ...net.IP) error {
	ca, err := newAuthority("ghcrsync-sandbox-serving")
	if err != nil {
		return err
	}

	kp, err := ca.serving(ips[0].String(), ips, nil)
	if err != nil {
		return err
	}

	for name, data := range map[string][]byte{"ca.crt": ca.certPEM(), "tls.crt": kp.CrtPEM, "tls.key": kp.KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}

	return nil
}

// newSigningKey makes the service-account token signing key (PKCS#8 PEM private, PKIX PEM public).
func newSigningKey() (private, public []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}

	der, err := stdx509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}

	pub, err := stdx509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, nil, err
	}

	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), nil
}
