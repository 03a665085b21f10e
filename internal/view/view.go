// Package view renders ghcrsync's results for people (Terraform-like text) and machines
// (versioned JSON). It computes nothing: every fact comes from the value it renders. Commands
// print nothing themselves: every line of ghcrsync's output is written here.
package view

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/diag"
)

// Format is a rendering.
type Format int

const (
	// Human is text for people.
	Human Format = iota
	// JSON is versioned JSON for machines.
	JSON
)

// FormatFor is JSON when asJSON, else Human.
func formatFor(asJSON bool) Format {
	if asJSON {
		return JSON
	}

	return Human
}

// Error renders a command's failure on stderr, with what to do next for configuration errors.
func Error(w io.Writer, err error) {
	fmt.Fprintf(w, "Error: %v\n", err)

	var cfgErr *config.Error
	if errors.As(err, &cfgErr) {
		fmt.Fprintln(w, "\nFix the configuration and run the command again; nothing was contacted.")
	}
}

// requestsLine renders what a command cost in calls.
func requestsLine(w io.Writer, kube, talos string) {
	fmt.Fprintf(w, "Requests: Kubernetes %s; Talos %s.\n", kube, talos)
}

// versionLine renders the version.
func versionLine(w io.Writer, version string) {
	fmt.Fprintln(w, "ghcrsync", version)
}

// VersionInfo is `ghcrsync version --json`.
type VersionInfo struct {
	Version     string `json:"version"`
	GoVersion   string `json:"go_version"`
	Platform    string `json:"platform"`
	PlanFormat  string `json:"plan_format_version"`
	StateFormat string `json:"state_format_version"`
}

// versionJSON prints the version as one JSON object.
func versionJSON(w io.Writer, v VersionInfo) error {
	return writeJSONLine(w, v)
}

// Signalled says a signal arrived and the command is winding down.
func Signalled(w io.Writer, signal string) {
	fmt.Fprintf(w, "Received %s: stopping at the next safe point (a second signal stops at once; the state is written before every mutation).\n", signal)
}

// SecondSignal says the command stops at once.
func SecondSignal(w io.Writer) {
	fmt.Fprintln(w, "Second signal: stopping now. Run `ghcrsync fences` to see what is held.")
}

// Warning renders a warning the command gives before it acts.
func Warning(w io.Writer, msg string) {
	fmt.Fprintf(w, "Warning: %s\n", oneLine(msg))
}

func mark(ok bool) string {
	if ok {
		return "✓"
	}

	return "✗"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}

	return "no"
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}

	return s
}

// oneLine keeps values read from the cluster on one line.
// oneLine renders a message from outside ghcrsync on one line: its whitespace collapsed, any
// control character left escaped (Clean).
func oneLine(s string) string { return Clean(strings.Join(strings.Fields(s), " ")) }

// validateHuman renders `ghcrsync validate` as terraform validate does: each finding with the
// line it is on.
func validateHuman(w io.Writer, v config.Validation) {
	for _, d := range v.Diagnostics {
		label := "Error"
		if d.Severity == diag.Warning {
			label = "Warning"
		}

		fmt.Fprintf(w, "%s: %s\n\n", label, oneLine(d.Summary))

		if d.Range != nil {
			fmt.Fprintf(w, "  on %s line %d", Clean(d.Range.Filename), d.Range.Start.Line)

			if d.Snippet != nil && d.Snippet.Context != nil {
				fmt.Fprintf(w, ", in %s", oneLine(*d.Snippet.Context))
			}

			fmt.Fprintln(w, ":")

			if d.Snippet != nil {
				for i, line := range strings.Split(d.Snippet.Code, "\n") {
					fmt.Fprintf(w, "  %4d: %s\n", d.Snippet.StartLine+i, Clean(line))
				}
			}

			fmt.Fprintln(w)
		}

		fmt.Fprintf(w, "  %s\n\n", oneLine(d.Detail))
	}

	if v.Valid {
		fmt.Fprintln(w, "Success! The configuration is valid.")
	}
}

// validateAnnotations annotates each finding on its file and line (a pull request shows it
// inline).
func validateAnnotations(w io.Writer, v config.Validation) {
	for _, d := range v.Diagnostics {
		level := AnnotateError
		if d.Severity == diag.Warning {
			level = AnnotateWarning
		}

		var at *Place
		if d.Range != nil {
			at = &Place{File: d.Range.Filename, Line: d.Range.Start.Line, Column: d.Range.Start.Column,
				EndLine: d.Range.End.Line, EndColumn: d.Range.End.Column}
		}

		annotateAt(w, level, "ghcrsync validate: "+d.Summary, d.Detail, at)
	}
}

// ValidateJSON is `ghcrsync validate --json`, in the shape of terraform validate's.
type ValidateJSON struct {
	FormatVersion string            `json:"format_version"`
	Valid         bool              `json:"valid"`
	ErrorCount    int               `json:"error_count"`
	WarningCount  int               `json:"warning_count"`
	Diagnostics   []diag.Diagnostic `json:"diagnostics"`
}

// validateJSONTo writes ValidateJSON.
func validateJSONTo(w io.Writer, v config.Validation) error {
	out := ValidateJSON{FormatVersion: "1.0", Valid: v.Valid, Diagnostics: v.Diagnostics}

	out.ErrorCount = diag.Errors(v.Diagnostics)
	out.WarningCount = len(v.Diagnostics) - out.ErrorCount

	return writeJSONLine(w, out)
}

// formattedFiles renders `ghcrsync fmt`: the name of each file it changed (or, with --check,
// would change), one per line, as terraform fmt.
func formattedFiles(w io.Writer, files []string) {
	for _, f := range files {
		fmt.Fprintln(w, Clean(f))
	}
}

// deprecated warns that a command is called by a name that will go.
func deprecated(w io.Writer, old, instead, why string) {
	fmt.Fprintf(w, "Warning: %s is deprecated; call %s instead: %s. %s will be removed in a later version.\n\n", old, instead, why, old)
}
