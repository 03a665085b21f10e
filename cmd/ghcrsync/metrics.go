package main

import (
	"context"
	"net/http"
	"time"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/metrics"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
)

// runMetrics is what an apply that ran from start to end says as metrics: its result (nil when it
// stopped before its run: a refused plan, a held Lease, an error) and its exit code.
func runMetrics(configuration string, res *apply.Result, code int, start, end time.Time) metrics.Run {
	r := metrics.Run{Configuration: configuration, Finished: end, Duration: end.Sub(start), ExitCode: code,
		Nodes: map[string]int{}, PullSecrets: map[string]int{}, Templates: map[string]int{}}

	if res == nil {
		r.Outcome = map[int]string{exitRefusedPlan: "refused", exitLeaseHeld: "lease-held"}[code]
		if r.Outcome == "" {
			r.Outcome = "error"
		}

		return r
	}

	r.Outcome, r.SafeToRevoke = view.RunOutcome(res), res.SafeToRevoke()

	c := res.Counts()
	for k, n := range c.Nodes {
		r.Nodes[string(k)] = n
	}

	for k, n := range c.Secrets {
		r.PullSecrets[string(k)] = n
	}

	for k, n := range c.Templates {
		r.Templates[string(k)] = n
	}

	if res.Verdict != nil {
		for _, v := range res.Verdict.All() {
			for _, u := range v.Still() {
				r.OldCredentialUses++

				if u.Kind == plan.UseNode {
					r.OldCredentialNodes++
				}
			}
		}
	}

	if res.Plan != nil {
		r.CredentialExpires = res.Plan.CredentialExpiresAt
	}

	return r
}

// writeMetrics writes the run's metrics where asked (--metrics-file, --metrics-push); a failure
// to is reported, never the run's outcome. cfg is the run's configuration (nil: the run stopped
// before its workspace opened, and the file is read for its identity, else its path names it).
func (a applyArgs) writeMetrics(ctx context.Context, warn func(string, error), cfg *config.Config, res *apply.Result, err error, start time.Time) {
	if a.metricsFile == "" && a.metricsPush == "" {
		return
	}

	if cfg == nil {
		cfg, _ = config.Load(a.config)
	}

	configuration := a.config
	if cfg != nil {
		configuration = cfg.Identity()
	}

	r := runMetrics(configuration, res, exitCode(err), start, time.Now())

	if a.metricsFile != "" {
		if werr := metrics.WriteFile(a.metricsFile, r); werr != nil {
			warn("the metrics file was not written", werr)
		}
	}

	if a.metricsPush != "" {
		// A run that was cancelled still reports: its own deadline, not the cancelled context.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()

		if perr := metrics.Push(pctx, &http.Client{Timeout: 15 * time.Second}, a.metricsPush, r); perr != nil {
			warn("the metrics were not pushed", perr)
		}
	}
}
