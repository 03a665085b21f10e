package workspace

import (
	"os"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/redact"
)

// Diagnostic is one finding of Validate.
type Diagnostic struct {
	Severity string `json:"severity"` // "error" or "warning"
	Summary  string `json:"summary"`
	Detail   string `json:"detail"`
}

// Validation is what Validate found: valid unless an error was.
type Validation struct {
	Valid       bool         `json:"valid"`
	Diagnostics []Diagnostic `json:"diagnostics"`
}

func (v *Validation) add(severity, summary, detail string) {
	v.Diagnostics = append(v.Diagnostics, Diagnostic{Severity: severity, Summary: summary, Detail: detail})
	if severity == "error" {
		v.Valid = false
	}
}

// Validate checks a configuration without contacting any cluster, registry or Talos API (a
// pull-request check): the file parses and every reference resolves (config.Load), a runtime
// probe image is set, and the SOPS file is a SOPS document whose credential value is there and
// encrypted; where an age key is at hand (SOPS_AGE_KEY_FILE, SOPS_AGE_KEY) the credential is
// decrypted and checked for the registry too — in memory only.
func Validate(path string) Validation {
	v := Validation{Valid: true, Diagnostics: []Diagnostic{}}

	cfg, err := config.Load(path)
	if err != nil {
		v.add("error", "Invalid configuration", err.Error())

		return v
	}

	if cfg.Nodes.Probe.Image == "" {
		v.add("error", "No runtime probe image",
			"apply proves each node's container runtime by pulling a private image with the node's own credential: set credential.prove "+
				"(its first image is the probe) or nodes.runtime_probe.image (docs/config.md)")
	}

	if err := credential.CheckStructure(cfg.Credential.SopsFile, cfg.Credential.Key); err != nil {
		v.add("error", "Invalid SOPS file", err.Error())

		return v
	}

	if os.Getenv("SOPS_AGE_KEY_FILE") == "" && os.Getenv("SOPS_AGE_KEY") == "" {
		v.add("warning", "Credential not decrypted",
			"no age key is at hand (SOPS_AGE_KEY_FILE, SOPS_AGE_KEY): the SOPS file's structure was checked, not the credential it holds")

		return v
	}

	if _, err := credential.Load(cfg.Credential.SopsFile, cfg.Credential.Key, cfg.Credential.Registry); err != nil {
		v.add("error", "Invalid credential", redact.Error(err))
	}

	return v
}
