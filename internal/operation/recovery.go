package operation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/liveness"
	"github.com/ghcrsync/ghcrsync/state"
	"github.com/ghcrsync/ghcrsync/state/kubestate"
)

// OpenStore opens the configured state backend.
func OpenStore(cfg *config.Config, kube *cluster.Connection) state.Store {
	if cfg.State.Backend == "kubernetes" {
		return &kubestate.Store{Client: kube.Client, Namespace: cfg.State.Namespace, Name: cfg.State.Secret}
	}

	return &state.Local{Path: cfg.State.Path}
}

// Checker is the configured liveness source, or nil.
func Checker(cfg *config.Config) fence.Checker {
	if cfg.Liveness == nil {
		return nil
	}

	return &liveness.GitHubActions{APIURL: cfg.Liveness.APIURL, Repository: cfg.Liveness.Repository, Token: os.Getenv(cfg.Liveness.TokenEnv)}
}

// FencesOptions are `ghcrsync fences`' and `ghcrsync release`'s common inputs.
type FencesOptions struct {
	ConfigPath string
	Holder     string
	Force      bool
	Now        func() time.Time
}

type recoveryCtx struct {
	cfg   *config.Config
	kube  *cluster.Connection
	store state.Store
	st    *state.State
}

func openRecovery(o FencesOptions, lock bool) (*recoveryCtx, error) {
	cfg, err := config.Load(o.ConfigPath)
	if err != nil {
		return nil, err
	}

	kube, err := cluster.Connect(cfg.Cluster.Kubeconfig, cfg.Cluster.Context)
	if err != nil {
		return nil, err
	}

	store := OpenStore(cfg, kube)

	if lock {
		if err := store.Lock(); err != nil {
			return nil, err
		}
	}

	st, err := store.Read()
	if err != nil {
		store.Unlock()

		return nil, err
	}

	return &recoveryCtx{cfg: cfg, kube: kube, store: store, st: st}, nil
}

func (r *recoveryCtx) report(ctx context.Context, o FencesOptions) (fence.Report, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}

	obs, err := fence.Observe(ctx, r.kube, r.st, r.cfg.Lease.Namespace, r.cfg.Lease.Name, Checker(r.cfg), now())
	if err != nil {
		return fence.Report{}, err
	}

	obs.ConfigPath, obs.Holder, obs.Force = r.cfg.Path, o.Holder, o.Force

	return fence.Classify(obs), nil
}

// Fences reports every fence ghcrsync holds, with liveness evidence. It writes nothing.
func Fences(ctx context.Context, o FencesOptions) (fence.Report, error) {
	r, err := openRecovery(o, false)
	if err != nil {
		return fence.Report{}, err
	}

	return r.report(ctx, o)
}

// ReleaseOptions are `ghcrsync release`'s inputs.
type ReleaseOptions struct {
	FencesOptions
	Node     string
	DryRun   bool
	Progress io.Writer
}

// ReleaseResult is what release found and did.
type ReleaseResult struct {
	Report   fence.Report
	Outcomes []fence.Outcome
}

// Failed counts fences left held.
func (r *ReleaseResult) Failed() int {
	n := 0

	for _, o := range r.Outcomes {
		if !o.Released {
			n++
		}
	}

	return n
}

// Release undoes the fences held by a run that is provably over (or named with --holder).
func Release(ctx context.Context, o ReleaseOptions) (*ReleaseResult, error) {
	if o.Force && o.Holder == "" {
		return nil, errors.New("--force needs the holder id to release (--holder ID), as terraform force-unlock needs the lock id: see `ghcrsync fences`")
	}

	r, err := openRecovery(o.FencesOptions, !o.DryRun)
	if err != nil {
		return nil, err
	}
	defer r.store.Unlock()

	rep, err := r.report(ctx, o.FencesOptions)
	if err != nil {
		return nil, err
	}

	if o.Node != "" {
		kept := rep.Fences[:0]
		for _, f := range rep.Fences {
			if f.Kind == fence.KindNode && f.Name == o.Node {
				kept = append(kept, f)
			}
		}

		rep.Fences = kept
	}

	res := &ReleaseResult{Report: rep}
	if o.DryRun {
		return res, nil
	}

	res.Outcomes = fence.Release(ctx, r.kube, rep, r.store, r.st, fence.ReleaseOptions{
		Node: o.Node, ReadyTimeout: r.cfg.Nodes.ReadyTimeout, Progress: o.Progress,
	})

	if run := r.st.Run; run != nil && run.Finished == nil && res.Failed() == 0 && o.Node == "" {
		now := time.Now().UTC()
		run.Finished, run.Outcome = &now, "terminated; its fences were released by ghcrsync release"

		if err := r.store.Write(r.st); err != nil {
			return res, err
		}
	}

	return res, nil
}

// reclaim releases, before an apply, the fences whose holder's run is provably over (a
// liveness source says so; mere expiry is never enough).
func reclaim(ctx context.Context, cfg *config.Config, kube *cluster.Connection, store state.Store, st *state.State, progress io.Writer) ([]fence.Outcome, error) {
	checker := Checker(cfg)
	if checker == nil {
		return nil, nil
	}

	obs, err := fence.Observe(ctx, kube, st, cfg.Lease.Namespace, cfg.Lease.Name, checker, time.Now())
	if err != nil {
		return nil, err
	}

	obs.ConfigPath = cfg.Path
	rep := fence.Classify(obs)

	var proven fence.Report

	for _, f := range rep.Fences {
		if v, ok := obs.Verdicts[f.Holder]; ok && v.Checked && v.Terminal {
			proven.Fences = append(proven.Fences, f)
		}
	}

	if len(proven.Fences) == 0 {
		return nil, nil
	}

	return fence.Release(ctx, kube, proven, store, st, fence.ReleaseOptions{ReadyTimeout: cfg.Nodes.ReadyTimeout, Progress: progress}), nil
}

// StatePull returns the state as JSON.
func StatePull(o FencesOptions) ([]byte, *state.State, error) {
	r, err := openRecovery(o, false)
	if err != nil {
		return nil, nil, err
	}

	b, err := json.MarshalIndent(r.st, "", "  ")

	return append(b, '\n'), r.st, err
}

// StateRemove forgets node's record without touching the cluster.
func StateRemove(o FencesOptions, node string) error {
	r, err := openRecovery(o, true)
	if err != nil {
		return err
	}
	defer r.store.Unlock()

	kept := r.st.Records[:0]
	found := false

	for _, rec := range r.st.Records {
		if rec.Node == node {
			found = true

			continue
		}

		kept = append(kept, rec)
	}

	if !found {
		return fmt.Errorf("the state (%s) has no record of %s", r.store.Describe(), node)
	}

	r.st.Records = kept

	return r.store.Write(r.st)
}

// StatePush writes a state file into the configured backend (migration from local). A backend
// that already holds another lineage is refused unless forced.
func StatePush(o FencesOptions, path string, force bool) (*state.State, error) {
	src, err := state.ReadLocal(path)
	if err != nil {
		return nil, err
	}

	if src.Lineage == "" {
		return nil, fmt.Errorf("%s holds no state (no lineage): nothing to push", path)
	}

	r, err := openRecovery(o, true)
	if err != nil {
		return nil, err
	}
	defer r.store.Unlock()

	if r.st.Lineage != "" && r.st.Lineage != src.Lineage && !force {
		return nil, fmt.Errorf("%s already holds state lineage %s (serial %d), not %s: pushing would replace another history; pass --force if that is intended",
			r.store.Describe(), r.st.Lineage, r.st.Serial, src.Lineage)
	}

	src.Serial = max(src.Serial, r.st.Serial)

	if err := r.store.Write(src); err != nil {
		return nil, err
	}

	return src, nil
}

// StoreDescription names the configured backend.
func StoreDescription(o FencesOptions) (string, error) {
	r, err := openRecovery(o, false)
	if err != nil {
		return "", err
	}

	return r.store.Describe(), nil
}
