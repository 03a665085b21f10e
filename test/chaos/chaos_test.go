// Package chaos is the seeded chaos campaign: full rotations on the sandbox (3 control planes,
// 3 workers, 4 autoscaled nodes, Talos 1.13 and 1.14 mixed) under faults drawn from each seed,
// then the on-call runbook (fences, release, a fresh apply), then the invariants. See
// docs/reliability.md. `make chaos` runs SEEDS seeds from SEED_BASE; `make chaos SEED=N`
// replays one; `make test` runs a few fixed seeds.
package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	// AUTOSCALER=real: the real cluster-autoscaler instead of the seeded simulation (make chaos
	// AUTOSCALER=real); its decisions are its own, so a seed replays the faults, not the autoscaler.
	sandboxtest.Main(m, sandbox.Options{
		ControlPlanes: 3, Workers: 3, Autoscaled: 4, TalosVersion: "1.13,1.14",
		Heartbeat: time.Second, Reboot: time.Second, AutoscalerInterval: time.Second, Seed: 7,
		Autoscaler: os.Getenv("AUTOSCALER"),
	})
}

// fixedSeeds run inside `make test`.
var fixedSeeds = []uint64{1, 2, 3}

// seeds reads SEED (one seed), or SEED_BASE and SEEDS (SEEDS seeds from SEED_BASE, default
// 1), else the fixed seeds.
func seeds(t *testing.T) []uint64 {
	num := func(k string, def uint64) uint64 {
		v := os.Getenv(k)
		if v == "" {
			return def
		}

		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q is not a number", k, v)
		}

		return n
	}

	if os.Getenv("SEED") != "" {
		return []uint64{num("SEED", 0)}
	}

	if os.Getenv("SEEDS") == "" {
		return fixedSeeds
	}

	base, n := num("SEED_BASE", 1), num("SEEDS", 0)
	out := make([]uint64, 0, n)

	for i := range n {
		out = append(out, base+i)
	}

	return out
}

// campaign is what the seeds share: one sandbox, the binary, the totals.
type campaign struct {
	sb  *sandbox.Sandbox
	cli *cli
	dir string

	pullOnce sync.Once
	pullErr  error

	// held and predicted count the pods whose eviction by a first apply a budget refused while
	// it allowed no disruption at plan time, and how many of them the plan had named.
	held, predicted int
}

func TestChaos(t *testing.T) {
	sb := sandboxtest.Get(t)

	dir := os.Getenv("CHAOS_DIR") // kept; else a temporary folder, kept only if a seed fails
	if dir == "" {
		d, err := os.MkdirTemp("", "ghcrsync-chaos-")
		if err != nil {
			t.Fatal(err)
		}

		dir = d
		t.Cleanup(func() {
			if !t.Failed() {
				_ = os.RemoveAll(d)
			}
		})
	}

	bin := sandboxtest.Binary(t)

	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
		"SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile),
	}
	c := &campaign{sb: sb, cli: &cli{bin: bin, env: env}, dir: dir}

	var (
		failed  []uint64
		kinds   = map[string]int{}
		kills   = map[string]int{}
		applies int
		begin   = time.Now()
		list    = seeds(t)
	)

	for i, seed := range list {
		r := &seedRun{
			c: c, sb: sb, kube: sb.Kube(), seed: seed,
			rng:      newRand(seed),
			second:   map[*proc]bool{},
			cordoned: map[string]bool{}, tainted: map[string]bool{}, staged: map[string]bool{}, carried: map[string]bool{},
		}

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		r.run(ctx)
		cancel()

		for _, k := range r.kinds {
			kinds[k]++
		}

		kills[strings.SplitN(r.kill, " ", 2)[0]]++
		applies += len(r.applies)

		verdict := "ok"
		if len(r.problems) > 0 {
			verdict = "FAIL"
			failed = append(failed, seed)
		}

		fmt.Printf("seed %d [%d/%d] %s %.1fs (%s): first apply %s, kill %s, %d converging apply(s); %s\n",
			seed, i+1, len(list), verdict, time.Since(start).Seconds(), strings.Join(r.stages, ", "), r.outcome, r.kill, r.converge, strings.Join(r.injected, " "))

		for _, p := range r.problems {
			t.Errorf("seed %d: %s", seed, p)
		}

		if len(r.problems) > 0 {
			t.Logf("seed %d: reproduce with: make chaos SEED=%d (files in %s)", seed, seed, filepath.Join(dir, fmt.Sprintf("seed-%d", seed)))
		}
	}

	fmt.Printf("chaos: %d seed(s), %d failed %v, %s wall, %d apply process(es); faults %s; kills %s; unsafe writes %d, interleaved writes %d\n",
		len(list), len(failed), failed, time.Since(begin).Round(time.Second), applies, counts(kinds), counts(kills),
		sb.Fleet().Stats().UnsafeWrites, sb.Fleet().Stats().InterleavedWrites)

	fmt.Printf("chaos: drain holds by a budget that allowed no disruption at plan time: %d pod(s) held, %d predicted by the plan\n", c.held, c.predicted)

	if calls := sb.HcloudCalls(); calls != nil {
		fmt.Printf("chaos: the real cluster-autoscaler created %d and deleted %d server(s)\n", calls["POST /v1/servers"], calls["DELETE /v1/servers/{id}"])
	}
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}

	slices.Sort(keys)

	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}

	return strings.Join(parts, " ")
}
