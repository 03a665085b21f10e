package release

import (
	"encoding/json"
	"time"
)

// The in-toto statement and SLSA provenance (v1) types: https://slsa.dev/provenance/v1.
const (
	StatementType  = "https://in-toto.io/Statement/v1"
	PredicateType  = "https://slsa.dev/provenance/v1"
	BuildType      = "https://github.com/ghcrsync/ghcrsync/release/v1"
	localBuilderID = "local:make release"
)

// Build is what the provenance says about the build.
type Build struct {
	Version   string   // the version stamped in the binaries
	Platforms []string // GOOS/GOARCH
	GoVersion string
	// Source: the repository's URI (git+https://…) and the commit built.
	Repository, Commit string
	// Builder: the workflow run that built it (GITHUB_SERVER_URL/GITHUB_REPOSITORY/
	// actions/runs/RUN_ID), or "" for a build on a person's machine.
	BuilderID, InvocationID string
	Started, Finished       time.Time
}

// Statement is an in-toto statement of SLSA provenance.
type Statement struct {
	Type          string     `json:"_type"`
	Subject       []Subject  `json:"subject"`
	PredicateType string     `json:"predicateType"`
	Predicate     Provenance `json:"predicate"`
}

// Provenance is the SLSA v1 predicate.
type Provenance struct {
	BuildDefinition BuildDefinition `json:"buildDefinition"`
	RunDetails      RunDetails      `json:"runDetails"`
}

// BuildDefinition says how it was built.
type BuildDefinition struct {
	BuildType            string               `json:"buildType"`
	ExternalParameters   map[string]any       `json:"externalParameters"`
	InternalParameters   map[string]any       `json:"internalParameters,omitempty"`
	ResolvedDependencies []ResourceDescriptor `json:"resolvedDependencies"`
}

// ResourceDescriptor names a source.
type ResourceDescriptor struct {
	URI    string `json:"uri"`
	Digest Digest `json:"digest"`
}

// RunDetails says who built it, and when.
type RunDetails struct {
	Builder  Builder  `json:"builder"`
	Metadata Metadata `json:"metadata"`
}

// Builder is the builder's identity.
type Builder struct {
	ID string `json:"id"`
}

// Metadata is the run's.
type Metadata struct {
	InvocationID string    `json:"invocationId,omitempty"`
	StartedOn    time.Time `json:"startedOn"`
	FinishedOn   time.Time `json:"finishedOn"`
}

// NewStatement is the provenance of subjects built as b.
func NewStatement(subjects []Subject, b Build) Statement {
	builder := b.BuilderID
	if builder == "" {
		builder = localBuilderID
	}

	return Statement{
		Type: StatementType, Subject: subjects, PredicateType: PredicateType,
		Predicate: Provenance{
			BuildDefinition: BuildDefinition{
				BuildType:          BuildType,
				ExternalParameters: map[string]any{"version": b.Version, "platforms": b.Platforms, "target": "make release"},
				InternalParameters: map[string]any{"go_version": b.GoVersion, "cgo_enabled": false, "flags": "-trimpath"},
				ResolvedDependencies: []ResourceDescriptor{{
					URI: b.Repository + "@" + b.Commit, Digest: Digest{GitCommit: b.Commit},
				}},
			},
			RunDetails: RunDetails{
				Builder:  Builder{ID: builder},
				Metadata: Metadata{InvocationID: b.InvocationID, StartedOn: b.Started.UTC(), FinishedOn: b.Finished.UTC()},
			},
		},
	}
}

// JSON is the statement as one line of JSON (a .intoto.jsonl file).
func (s Statement) JSON() ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}

	return append(b, '\n'), nil
}
