package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/admission"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// newAdmission serves the opt-in validating webhook of the node templates (internal/admission;
// docs/deploy/admission.yaml, docs/rbac.md).
func newAdmission() *cobra.Command {
	var cfgPath, listen, cert, key, logLevel, logFormat string

	cmd := &cobra.Command{
		Use:   "admission [--config ghcrsync.hcl] --tls-cert FILE --tls-key FILE [--listen :8443]",
		Short: "Serve the validating webhook that refuses a node template change other than the registry credential",
		Long: "Serve, over TLS at /validate, the validating webhook docs/deploy/admission.yaml registers: an update of a\n" +
			"node template Secret (the configuration's node_template blocks) is admitted only when it changes nothing but\n" +
			"the registry credential in the configured key. /healthz answers the probes. The key pair is read again when\n" +
			"its files change. Nothing is contacted: the configuration's node templates and registry are all it reads.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cert == "" || key == "" {
				return errors.New("admission: --tls-cert and --tls-key are required (the API server calls webhooks over TLS only)")
			}

			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}

			if len(cfg.NodeTemplates) == 0 {
				return fmt.Errorf("admission: %s configures no node_template: there is nothing to guard", cfgPath)
			}

			log, err := newLogger(cmd.ErrOrStderr(), logLevel, logFormat)
			if err != nil {
				return err
			}

			s := admission.Server{Addr: listen, CertFile: cert, KeyFile: key,
				Handler: admission.Handler{Templates: cfg.NodeTemplates, Registry: cfg.Credential.Registry, Log: log}}

			return s.Serve(cmd.Context(), func(addr string) {
				view.NewAdmission(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()}).Listening(addr, len(cfg.NodeTemplates))
			})
		},
	}

	f := cmd.Flags()
	f.StringVar(&cfgPath, "config", defaultConfig(), "configuration file (its node_template blocks and credential registry)")
	f.StringVar(&listen, "listen", ":8443", "address to serve on")
	f.StringVar(&cert, "tls-cert", "", "serving certificate (PEM), read again when it changes")
	f.StringVar(&key, "tls-key", "", "its private key (PEM)")
	f.StringVar(&logLevel, "log-level", "info", "log level: trace, debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json (one object per line)")

	return cmd
}
