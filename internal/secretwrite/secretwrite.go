// Package secretwrite is the vocabulary of the writes the fan-out makes — consumer pull secrets,
// node templates, the root Flux secret — without a client: what a fan-out is given (Options),
// what became of each write (Result, Outcome), and the points a test may act at (Hooks). The
// writes themselves are internal/fanout's.
package secretwrite

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/config"
)

// Outcome is what became of a pull secret.
type Outcome string

// Outcomes of a pull secret.
const (
	Written   Outcome = "written"
	Unchanged Outcome = "unchanged"
	Skipped   Outcome = "skipped"
	Failed    Outcome = "failed"
	HeldBack  Outcome = "held-back"
)

// Result is one pull secret's or node template's outcome.
type Result struct {
	Namespace, Secret, Role string
	Key                     string // a node template's key in the Secret ("" for a pull secret)
	Outcome                 Outcome
	Message                 string
	// NotProved is, for the root secret written under RootProof, why Flux's root source could not
	// pull with it ("": it did, or nothing was asked).
	NotProved string
}

// RecordName is the name the state records the write under: the Secret, or for a node template
// the Secret and its key.
func (r Result) RecordName() string { return RecordNameOf(r.Secret, r.Key) }

// RecordNameOf is the name the state records a write under: the Secret, or for a node template
// the Secret and its key.
func RecordNameOf(secret, key string) string {
	if key == "" {
		return secret
	}

	return secret + "[" + key + "]"
}

// Hooks let tests act at exact points.
type Hooks struct {
	// BetweenReadAndWrite runs after a secret was read and before it is written.
	BetweenReadAndWrite func(namespace, name string, attempt int)
	// BetweenTemplateReadAndWrite runs after a node template was read and rewritten in memory,
	// before the update.
	BetweenTemplateReadAndWrite func(t config.NodeTemplate, attempt int)
}

// Options configure a fan-out.
type Options struct {
	Data []byte // the dockerconfigjson to write
	// Tenants are the tenant credentials' dockerconfigjson, by credential name: a pull secret of
	// a tenant (its plan entry's Credential) receives its tenant's, never Data.
	Tenants map[string][]byte
	// Configuration and Credential are the marks every written pull secret carries (the
	// configuration's identity, the cluster credential's name; a tenant's secret its own).
	Configuration, Credential string
	// Registry, Username and Password are the credential the node templates receive.
	Registry, Username, Password string
	// Templates are the configured node templates (their plan entries say which need a write).
	Templates     []config.NodeTemplate
	OCIRepository string // reconciled after the root secret changed ("" = none)
	// RootProof, when positive, waits up to that long after the root secret's write for Flux's
	// source-controller to handle the reconcile asked of OCIRepository, and judges it then
	// (flux_root.prove): Result.NotProved says why Flux could not pull with the new credential.
	RootProof time.Duration
	// Assert reports an error unless the run still holds its Lease, read from the API now: it
	// runs before each write is recorded and again between the write's read and the write
	// itself, so a Lease taken or deleted since the heartbeat's last look writes nothing.
	Assert func(context.Context) error
	Record func(namespace, name, role, outcome string) error // state write before each mutation
	Hooks  Hooks
	// Log receives the full text of an API answer a result names only by class (redact.Logged).
	Log hclog.Logger
	// Clock times the restarts and the waits between attempts (nil: clock.System).
	Clock clock.Clock

	// DryRun makes every write a server-side dry run (fanout.DryRun sets it).
	DryRun bool
}
