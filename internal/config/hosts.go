package config

import (
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// hosts checks a trusted_hosts list: host names only, lower-cased.
func (d *decoder) hosts(list []string, rng hcl.Range) []string {
	out := make([]string, 0, len(list))

	for _, h := range list {
		if h == "" || strings.ContainsAny(h, "/:@ ") {
			d.errorf(rng, "Invalid trusted host", "trusted_hosts lists host names, like \"auth.example.com\" (no scheme, port or path); %q is not one.", h)

			continue
		}

		out = append(out, strings.ToLower(h))
	}

	return out
}
