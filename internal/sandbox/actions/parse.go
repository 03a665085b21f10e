package actions

import (
	"strings"

	"github.com/rhysd/actionlint"
)

// NewerThanTheLinter reports whether an actionlint error is about a workflow key GitHub has
// and actionlint does not know yet: concurrency's queue (GitHub, May 2026), which the shipped
// deploy lanes use (queue: max) and actionlint v1.7.12 still calls unexpected.
func NewerThanTheLinter(e *actionlint.Error) bool {
	return e.Kind == "syntax-check" && strings.HasPrefix(e.Message, `unexpected key "queue" for "concurrency" section`)
}

// Parse is actionlint's parser without the errors NewerThanTheLinter names.
func Parse(b []byte) (*actionlint.Workflow, []*actionlint.Error) {
	wf, errs := actionlint.Parse(b)

	var out []*actionlint.Error

	for _, e := range errs {
		if !NewerThanTheLinter(e) {
			out = append(out, e)
		}
	}

	return wf, out
}
