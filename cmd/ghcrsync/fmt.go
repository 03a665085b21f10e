package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/atomicfile"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

func newFmt() *cobra.Command {
	var (
		check, recursive bool
	)

	cmd := &cobra.Command{
		Use:   "fmt [FILE|DIR]...",
		Short: "Rewrite configuration files in the canonical HCL layout (terraform fmt)",
		Long: `Fmt rewrites each configuration file in HCL's canonical layout: equals signs aligned, two-space
indentation, no trailing spaces. With no argument it formats --config; a folder stands for its *.hcl
files (--recursive: and those below it). It prints the name of each file it changed. A file that does
not parse is left as it is and reported with its line (exit 1).

--check writes nothing: it lists the files that are not formatted and exits 2 if there is one (a
pull-request check; terraform fmt -check exits 3, which is ghcrsync's refused plan), 0 otherwise.`,
		Example: `  ghcrsync fmt
  ghcrsync fmt --check clusters/`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				cfg, _ := cmd.Flags().GetString("config")
				args = []string{cfg}
			}

			return format(cmd, args, check, recursive)
		},
	}

	cmd.Flags().String("config", defaultConfig(), "configuration file formatted when no FILE is given")
	cmd.Flags().BoolVar(&check, "check", false, "write nothing; exit 2 if a file is not formatted")
	cmd.Flags().BoolVar(&recursive, "recursive", false, "also format the *.hcl files in folders below a DIR")

	return cmd
}

// format formats the files args name (or, with check, names those it would change: exit 2 when
// there is one); a file that does not parse is left as it is and reported with its line.
func format(cmd *cobra.Command, args []string, check, recursive bool) error {
	v := view.NewFmt(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()})

	files, err := hclFiles(args, recursive)
	if err != nil {
		return err
	}

	var changed []string

	for _, f := range files {
		src, err := readlimit.File(f, readlimit.Config)
		if err != nil {
			return fmt.Errorf("fmt %s: %w", f, err)
		}

		out, err := config.Format(src, f)

		var ce *config.Error
		if errors.As(err, &ce) {
			v.Unparsed(config.Validation{Diagnostics: ce.Findings(f)})

			return fmt.Errorf("fmt %s: the file does not parse; fix the error above, then run fmt again", f)
		}

		if string(out) == string(src) {
			continue
		}

		changed = append(changed, f)

		if check {
			continue
		}

		if err := atomicfile.Write(f, out, 0o644); err != nil {
			return fmt.Errorf("fmt %s: %w", f, err)
		}
	}

	v.Formatted(changed)

	return fmtStatus(changed, check)
}

// hclFiles are the files args name: each file as given, each folder's *.hcl files.
func hclFiles(args []string, recursive bool) ([]string, error) {
	var files []string

	for _, a := range args {
		fi, err := os.Stat(a)
		if err != nil {
			return nil, fmt.Errorf("fmt: %w (name a configuration file or a folder)", err)
		}

		if !fi.IsDir() {
			files = append(files, a)

			continue
		}

		err = filepath.WalkDir(a, func(p string, d os.DirEntry, err error) error {
			switch {
			case err != nil:
				return err
			case d.IsDir() && p != a && !recursive:
				return filepath.SkipDir
			case !d.IsDir() && filepath.Ext(p) == ".hcl":
				files = append(files, p)
			}

			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("fmt: %w", err)
		}
	}

	return files, nil
}
