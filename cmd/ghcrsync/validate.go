package main

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

func newValidate() *cobra.Command {
	var (
		cfg        string
		asJSON     bool
		listInputs bool
	)

	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check the configuration and the SOPS file, contacting no cluster (a pull-request check)",
		Long: `Validate checks the configuration without contacting any cluster, registry or Talos API: the file
parses and every reference resolves, a runtime probe image is set, and the SOPS file is a SOPS
document whose credential value is there and encrypted. With an age key at hand (SOPS_AGE_KEY_FILE,
SOPS_AGE_KEY) the credential is decrypted and checked for the registry too, in memory only.
Each finding names its file, line and column (a finding about the SOPS file or the credential
points at the sops_file that names it; one about the probe image, at the credential block; a
configuration that cannot be read at all names its path); --json gives terraform validate's diagnostics (one
per error, each with its range and snippet), and under GitHub Actions each is annotated on its line
of the pull request. Exit 0 when valid, 1 otherwise (as terraform validate).`,
		Example: `  ghcrsync validate --config ghcrsync.hcl
  ghcrsync validate --json | jq -e .valid
  ghcrsync validate --list-inputs             # ghcrsync.hcl, then each SOPS file it names`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if listInputs {
				return inputs(cmd, cfg)
			}

			return validate(cmd, cfg)
		},
	}

	cmd.Flags().StringVar(&cfg, "config", defaultConfig(), "configuration file")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON (terraform validate's shape)")
	cmd.Flags().BoolVar(&listInputs, "list-inputs", false, "print the files the configuration reads, one per line: itself and each SOPS file "+
		"(relative to the working directory when under it): what a workflow triggers on and takes from a pull request")

	return cmd
}

// validate checks the configuration at cfg and renders the findings: human or JSON, and annotated
// on their lines under GitHub Actions; exit 1 when it is not valid.
func validate(cmd *cobra.Command, cfg string) error {
	v := config.Validate(cfg)

	s, err := streams(cmd)
	if err != nil {
		return err
	}

	if err := view.NewValidate(s).Result(v); err != nil {
		return err
	}

	return validateStatus(v)
}

// inputs prints the files the configuration reads: itself, then each SOPS file, each relative to
// the working directory when it is under it (a path git show takes), else absolute.
func inputs(cmd *cobra.Command, path string) error {
	cfg, err := config.LoadNames(path)
	if err != nil {
		return err
	}

	wd, err := os.Getwd()
	if err != nil {
		return err
	}

	files := append([]string{cfg.Path}, cfg.SopsFiles()...)
	for i, f := range files {
		if rel, err := filepath.Rel(wd, f); err == nil && !strings.HasPrefix(rel, "..") {
			files[i] = filepath.ToSlash(rel)
		}
	}

	view.NewValidate(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()}).Inputs(files)

	return nil
}
