package actions

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/rhysd/actionlint"
)

// Event is what happened in the repository, as GitHub decides from it which workflows run.
type Event struct {
	// Name is the event: pull_request, pull_request_target, push or schedule.
	Name string
	// Branch is the branch pushed to, or the pull request's base branch; Tag the tag pushed
	// (a push is of one or the other).
	Branch, Tag string
	// Changed are the files the push or the pull request changes.
	Changed []string
}

// Triggered lists the workflows of dir (a tree's .github/workflows) that the event starts,
// by file name. Which tree is GitHub's rule and the caller's: a pull_request runs the pull
// request's own workflows, a pull_request_target the base branch's, a push the pushed commit's,
// a schedule the default branch's. A trigger's branches and paths filters are applied (GitHub's
// globs: * within a path segment, ** across them); its activity types are not (every pull
// request here is opened or pushed to, the default types).
func Triggered(dir string, ev Event) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yml"))
	if err != nil {
		return nil, err
	}

	var out []string

	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}

		wf, errs := Parse(b)
		if len(errs) > 0 {
			return nil, errs[0]
		}

		if triggers(wf, ev) {
			out = append(out, filepath.Base(f))
		}
	}

	return out, nil
}

func triggers(wf *actionlint.Workflow, ev Event) bool {
	for _, on := range wf.On {
		switch on := on.(type) {
		case *actionlint.ScheduledEvent:
			if ev.Name == "schedule" {
				return true
			}
		case *actionlint.WebhookEvent:
			if on.Hook.Value == ev.Name && refs(on, ev) && filtered(on.Paths, on.PathsIgnore, ev.Changed) {
				return true
			}
		}
	}

	return false
}

// refs applies a trigger's branch and tag filters, as GitHub does for a push: a trigger that
// filters only tags runs for no branch, one that filters only branches for no tag, one with
// neither for both.
func refs(on *actionlint.WebhookEvent, ev Event) bool {
	branches, tags := on.Branches != nil || on.BranchesIgnore != nil, on.Tags != nil || on.TagsIgnore != nil

	switch {
	case ev.Tag != "" && !tags:
		return !branches
	case ev.Tag != "":
		return filtered(on.Tags, on.TagsIgnore, []string{ev.Tag})
	case !branches:
		return !tags
	}

	return filtered(on.Branches, on.BranchesIgnore, []string{ev.Branch})
}

// filtered applies an include and an ignore filter to values: with neither, everything
// passes; with an include filter, one value must match it; with an ignore filter, one value
// must match none of it.
func filtered(include, ignore *actionlint.WebhookEventFilter, values []string) bool {
	switch {
	case include != nil:
		return slices.ContainsFunc(values, func(v string) bool { return matchesAny(include, v) })
	case ignore != nil:
		return slices.ContainsFunc(values, func(v string) bool { return !matchesAny(ignore, v) })
	}

	return true
}

func matchesAny(f *actionlint.WebhookEventFilter, v string) bool {
	for _, p := range f.Values {
		if glob(p.Value).MatchString(v) {
			return true
		}
	}

	return false
}

// glob is a GitHub filter pattern as a regular expression: ** any characters, * any but /,
// ? one character, everything else literal.
func glob(p string) *regexp.Regexp {
	var b strings.Builder

	b.WriteString("^")

	for i := 0; i < len(p); i++ {
		switch {
		case strings.HasPrefix(p[i:], "**"):
			b.WriteString(".*")
			i++
		case p[i] == '*':
			b.WriteString("[^/]*")
		case p[i] == '?':
			b.WriteString(".")
		default:
			b.WriteString(regexp.QuoteMeta(p[i : i+1]))
		}
	}

	b.WriteString("$")

	return regexp.MustCompile(b.String())
}
