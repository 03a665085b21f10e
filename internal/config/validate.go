package config

import (
	"errors"
	"fmt"
	"os"

	"github.com/hashicorp/hcl/v2"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/diag"
	"github.com/ghcrsync/ghcrsync/internal/redact"
)

// Validation is what Validate found: valid unless an error was.
type Validation struct {
	Valid       bool              `json:"valid"`
	Diagnostics []diag.Diagnostic `json:"diagnostics"`
}

func (v *Validation) add(ds ...diag.Diagnostic) {
	v.Diagnostics = append(v.Diagnostics, ds...)
	v.Valid = v.Valid && diag.Errors(ds) == 0
}

// Validate checks a configuration without contacting any cluster, registry or Talos API (a
// pull-request check): the file parses and every reference resolves (config.Load), a runtime
// probe image is set, and the SOPS file is a SOPS document whose credential value is there and
// encrypted; where an age key is at hand (SOPS_AGE_KEY_FILE, SOPS_AGE_KEY) the credential is
// decrypted and checked for the registry too — in memory only.
func Validate(path string) Validation {
	v := Validation{Valid: true, Diagnostics: []diag.Diagnostic{}}

	cfg, err := Load(path)

	var cfgErr *Error

	switch {
	case errors.As(err, &cfgErr):
		// One diagnostic per HCL error, each with its place: a pull request annotates each line.
		v.add(cfgErr.Findings(path)...)

		return v
	case err != nil:
		v.add(diag.New(diag.Error, "Invalid configuration", err.Error()))

		return v
	}

	if cfg.Nodes.Probe.Image == "" {
		v.add(cfg.Finding(hcl.DiagError, "No runtime probe image",
			"apply proves each node's container runtime by pulling a private image with the node's own credential: set credential.prove "+
				"(its first image is the probe) or nodes.runtime_probe.image (docs/config.md)", cfg.Credential.Where, path))
	}

	v.credentials(cfg, path)

	return v
}

// credentials checks each credential's SOPS file, and with an age key at hand the credential in
// it; several credentials: each diagnostic names its credential (one: as it always read).
func (v *Validation) credentials(cfg *Config, path string) {
	creds := []Credential{cfg.Credential}
	for _, t := range cfg.Tenants {
		creds = append(creds, t.Credential)
	}

	named := func(c Credential, msg string) string {
		if len(creds) == 1 {
			return msg
		}

		return fmt.Sprintf("credential %q: %s", c.Name, msg)
	}

	structured := true

	for _, c := range creds {
		if err := credential.CheckStructure(c.SopsFile, c.Key); err != nil {
			v.add(cfg.Finding(hcl.DiagError, "Invalid SOPS file", named(c, err.Error()), c.SopsWhere, path))

			structured = false
		}
	}

	if !structured {
		return
	}

	if os.Getenv("SOPS_AGE_KEY_FILE") == "" && os.Getenv("SOPS_AGE_KEY") == "" {
		v.add(cfg.Finding(hcl.DiagWarning, "Credential not decrypted",
			"no age key is at hand (SOPS_AGE_KEY_FILE, SOPS_AGE_KEY): the SOPS file's structure was checked, not the credential it holds",
			cfg.Credential.SopsWhere, path))

		return
	}

	for _, c := range creds {
		if _, err := credential.Load(c.SopsFile, c.Key, c.Registry); err != nil {
			v.add(cfg.Finding(hcl.DiagError, "Invalid credential", named(c, redact.Error(err)), c.SopsWhere, path))
		}
	}
}
