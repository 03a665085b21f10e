package config

import (
	"slices"
	"strconv"
	"strings"
)

// envValue is one value env() returned while the configuration was decoded.
type envValue struct{ name, value string }

// minEnvValue is the length from which a value env() returned is hidden wherever it appears in
// a message, not only where a message quotes it: shorter values (a number, "true") are no
// secret, and hiding them would garble the message.
const minEnvValue = 4

// withoutEnvValues shows every value env() returned as the variable it came from: a secret put
// in the environment (a token, a URL with credentials) is never repeated by a configuration
// error, which CI logs and pull-request comments show.
func withoutEnvValues(msg string, envs []envValue) string {
	// Longest first, so a value inside another is not replaced half-way.
	envs = slices.Clone(envs)
	slices.SortFunc(envs, func(a, b envValue) int { return len(b.value) - len(a.value) })

	for _, e := range envs {
		if e.value == "" {
			continue
		}

		msg = strings.ReplaceAll(msg, strconv.Quote(e.value), `the value of env("`+e.name+`")`)

		if len(e.value) >= minEnvValue {
			msg = strings.ReplaceAll(msg, e.value, `<env("`+e.name+`")>`)
		}
	}

	return msg
}
