package sandbox

import (
	"context"
	stdx509 "crypto/x509"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// talosRoles are the roles a client certificate may carry, as Talos's role package knows them.
var talosRoles = []string{roleAdmin, roleOperator, roleReader, "os:etcd:backup"}

// GenerateClientConfiguration mints a client certificate and its talosconfig, as machined does
// for `talosctl config new`: on a control-plane node only, for known roles, with a positive TTL;
// the certificate carries the roles as its organizations and no common name, and expires after
// the TTL; the talosconfig's context is named ROLE@CLUSTER for one role, and has no endpoints
// (talosctl adds its own).
func (a *apid) GenerateClientConfiguration(ctx context.Context, req *machine.GenerateClientConfigurationRequest) (*machine.GenerateClientConfigurationResponse, error) {
	msgs, err := fanOut(a, ctx, func(m *Machine, _ *common.Metadata) (*machine.GenerateClientConfiguration, error) {
		if m.Role != RoleControlPlane {
			return nil, status.Error(codes.FailedPrecondition, "generate client configuration is only supported on control plane nodes")
		}

		return a.clientConfiguration(req)
	}, func(md *common.Metadata) *machine.GenerateClientConfiguration {
		return &machine.GenerateClientConfiguration{Metadata: md}
	})
	if err != nil {
		return nil, err
	}

	return &machine.GenerateClientConfigurationResponse{Messages: msgs}, nil
}

func (a *apid) clientConfiguration(req *machine.GenerateClientConfigurationRequest) (*machine.GenerateClientConfiguration, error) {
	ttl := req.GetCrtTtl().AsDuration()
	if ttl <= 0 {
		return nil, status.Error(codes.InvalidArgument, "crt_ttl should be positive")
	}

	var roles []string

	for _, r := range req.GetRoles() {
		if slices.Contains(talosRoles, r) && !slices.Contains(roles, r) {
			roles = append(roles, r)
		}
	}

	now := time.Now()

	kp, err := x509.NewKeyPair(a.ca.ca,
		x509.Organization(roles...),
		x509.ECDSA(true),
		x509.NotBefore(now),
		x509.NotAfter(now.Add(ttl)),
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}),
	)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}

	name := "sandbox"
	if len(roles) == 1 {
		name = strings.TrimPrefix(roles[0], "os:") + "@" + name
	}

	cert := &x509.PEMEncodedCertificateAndKey{Crt: kp.CrtPEM, Key: kp.KeyPEM}

	b, err := clientconfig.NewConfig(name, nil, a.ca.certPEM(), cert).Bytes()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}

	return &machine.GenerateClientConfiguration{Ca: a.ca.certPEM(), Crt: kp.CrtPEM, Key: kp.KeyPEM, Talosconfig: b}, nil
}
