// Package examples holds ghcrsync's example configurations, embedded so that tools (the
// sandbox) render them rather than keep copies.
package examples

import "embed"

// FS holds every example configuration (*.hcl).
//
//go:embed *.hcl
var FS embed.FS
