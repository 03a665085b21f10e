package config

import (
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
)

// Format is src in HCL's canonical layout (`ghcrsync fmt`, as terraform fmt): aligned equals
// signs, indentation by two spaces, no trailing spaces. A file that does not parse is not
// formatted: its diagnostics are returned as an *Error, so nothing is rewritten from a guess.
func Format(src []byte, filename string) ([]byte, error) {
	if _, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos); diags.HasErrors() {
		f := &hcl.File{Bytes: src}

		return nil, &Error{Diagnostics: diags, Files: map[string]*hcl.File{filename: f}}
	}

	return hclwrite.Format(src), nil
}
