// Package apiload checks ghcrsync's load on the API server. It stays flat while a drain waits: a
// pod a PodDisruptionBudget holds is asked for again with a backoff, and the check before each
// eviction (where may the pod land?) reads the run's one Node watch, never a new list of every
// Node. And a live rotation costs each node its probe pod's create and its verified marker's
// patch: the guards read the run's Node watch, one watch follows every probe, the probe pods go
// a batch per request. Counted by ghcrsync's own tally of its requests (`apply --verbose`).
package apiload

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	// prod-worker-1 and -2 run Talos 1.13 (a fence: the drain tests), prod-worker-3 to -8 Talos
	// 1.14 (live: the live path's count).
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 8, AutoscalerPaused: true, NoWorkloads: true, Heartbeat: time.Second, Seed: 44,
		TalosVersion: "1.13,1.13,1.13,1.14,1.14,1.14,1.14,1.14,1.14"})
}

// requests reads apply --verbose's tally: how many requests of kind (LIST, WATCH, POST…).
func requests(t *testing.T, stderr, kind string) int {
	t.Helper()

	for _, l := range strings.Split(stderr, "\n") {
		if !strings.HasPrefix(l, "Requests: Kubernetes") {
			continue
		}

		if m := regexp.MustCompile(`\b` + kind + ` (\d+)`).FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])

			return n
		}

		return 0
	}

	t.Fatalf("apply --verbose reported no requests:\n%s", stderr)

	return 0
}

// rotate rotates the credential and applies it to prod-worker-1 only (its drain meets the held
// pod), while hold is how long the budget refuses the pod's eviction (0: it never does).
func rotate(t *testing.T, sb *sandbox.Sandbox, hold time.Duration) (lists, watches, evictions int) {
	t.Helper()

	kube := sb.Kube()
	ctx := context.Background()

	if _, err := sb.RotateSecret(fmt.Sprintf("apiload-held-%s", hold)); err != nil { // a user of its own
		t.Fatal(err)
	}

	labels := map[string]string{"app": "held"}

	// The pod runs on prod-worker-1 again (it waited Pending while the node rebooted).
	sandboxtest.Eventually(t, 60*time.Second, "the held pod runs on prod-worker-1", func() error {
		return podRunsOn(ctx, sb, "prod-worker-1")
	})

	if hold > 0 {
		sandboxtest.Budget(t, kube, "held", "held", labels, sandboxtest.MinAvailable(1), 1)

		relax := time.AfterFunc(hold, func() {
			_ = kube.PolicyV1().PodDisruptionBudgets("held").Delete(context.Background(), "held", metaDelete)
		})
		t.Cleanup(func() { relax.Stop() })
	} else {
		_ = kube.PolicyV1().PodDisruptionBudgets("held").Delete(ctx, "held", metaDelete)
	}

	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		// The budget holds the drain for good until it is relaxed: the drain waits (held_drain).
		return strings.Replace(s, "nodes {\n", "nodes {\n  selector = \"kubernetes.io/hostname=prod-worker-1\"\n  verdict  = \"selected\"\n", 1) +
			"\nmaintenance {\n  held_drain = \"wait\"\n}\n"
	})

	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--verbose", "--config", cfg)
	if code != 0 || !strings.Contains(stdout, "prod-worker-1") {
		t.Fatalf("apply (budget held %s): exit %d\n%s\n%s", hold, code, stdout, stderr)
	}

	return requests(t, stderr, "LIST"), requests(t, stderr, "WATCH"), strings.Count(stderr, "pod held/")
}

// A drain whose pod a budget holds for 30 s makes as many Node lists as one that meets no
// budget: the destinations come from the run's watch (one LIST and its WATCH), and the pod's
// eviction is asked again with a backoff (1 s doubling to 8 s, jittered), not every 2 s. Before
// this, every attempt listed every Node: the same hold cost about 15 LISTs more.
func TestADrainHeldByABudgetAddsNoLists(t *testing.T) {
	sb := sandboxtest.Get(t)
	sandboxtest.PinnedDeployment(t, sb.Kube(), "held", "held", "prod-worker-1")

	freeLists, freeWatches, _ := rotate(t, sb, 0)
	heldLists, heldWatches, retries := rotate(t, sb, 30*time.Second)

	t.Logf("LISTs: %d with no budget, %d with the pod held 30 s (WATCH %d, %d; %d progress lines on the held pod)",
		freeLists, heldLists, freeWatches, heldWatches, retries)

	if heldLists-freeLists > 2 {
		t.Fatalf("a drain held 30 s by a budget made %d LISTs, %d more than one that met no budget: the destination check lists Nodes per attempt",
			heldLists, heldLists-freeLists)
	}
}

var metaDelete = metav1.DeleteOptions{}

// podRunsOn checks the held Deployment's pod runs on node.
func podRunsOn(ctx context.Context, sb *sandbox.Sandbox, node string) error {
	pods, err := sb.Kube().CoreV1().Pods("held").List(ctx, metav1.ListOptions{LabelSelector: "app=held"})
	if err != nil {
		return err
	}

	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			return nil
		}
	}

	return fmt.Errorf("%d pods, none running on %s", len(pods.Items), node)
}

// liveNodes are the workers on Talos 1.14 (TestMain).
var liveNodes = []string{"prod-worker-3", "prod-worker-4", "prod-worker-5", "prod-worker-6", "prod-worker-7", "prod-worker-8"}

// stepCounts reads apply --verbose's "Requests by step" line for step: side's requests
// ("Kubernetes" by kind, "Talos" by method; none: an empty map).
func stepCounts(t *testing.T, stderr, step, side string) map[string]int {
	t.Helper()

	for _, l := range strings.Split(stderr, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || !strings.HasPrefix(strings.TrimSpace(l), step+" ") || f[len(strings.Fields(step))] != "Kubernetes" {
			continue
		}

		return sideCounts(l, side)
	}

	return map[string]int{}
}

// sideCounts reads one tally line ("Kubernetes 3 (GET 2, LIST 1); Talos 4 (List 4)"): side's
// requests by kind.
func sideCounts(line, side string) map[string]int {
	out := map[string]int{}

	kube, talos, _ := strings.Cut(line, "; Talos")
	if side == "Talos" {
		kube = talos
	}

	for _, m := range regexp.MustCompile(`([A-Za-z]+) (\d+)`).FindAllStringSubmatch(kube, -1) {
		if m[1] != "Kubernetes" { // the side's total
			out[m[1]], _ = strconv.Atoi(m[2])
		}
	}

	return out
}

// A live rotation of six nodes costs each its probe pod's create and its verified marker's
// patch, and the run a few requests more: no node step reads a Node (the run's Node watch
// answers; a patch that lost to a heartbeat reads once and tries again), none watches or lists
// (one probe watch follows every proof), the probe pods go a batch per request, and a node
// rotated live writes no Event of its own (the Lease's release Event counts them). Measured
// before this: 7 requests a node in these steps (2 GETs before the Talos write, 2 more before the
// marker, a WATCH and a LIST per proof, its DELETE) and 3 Events.
func TestALiveRotationCostsACreateAndAPatchANode(t *testing.T) {
	sb := sandboxtest.Get(t)

	if _, err := sb.RotateSecret("apiload-live"); err != nil {
		t.Fatal(err)
	}

	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		return strings.Replace(s, "nodes {\n", "nodes {\n  selector = \"kubernetes.io/hostname in ("+strings.Join(liveNodes, ",")+")\"\n  verdict  = \"selected\"\n", 1)
	})

	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--verbose", "--config", cfg)
	if code != 0 || strings.Count(stdout, "rotated live") != len(liveNodes) {
		t.Fatalf("apply: exit %d, want every one of %v rotated live\n%s\n%s", code, liveNodes, stdout, stderr)
	}

	nodes := len(liveNodes)
	sum := map[string]int{}

	for _, step := range []string{"configure", "restart", "prove"} {
		for k, v := range stepCounts(t, stderr, step, "Kubernetes") {
			sum[k] += v
		}
	}

	conflicts := sum["PATCH"] - nodes
	t.Logf("the node steps' Kubernetes requests: %v for %d nodes (%d patches lost to a heartbeat); DELETE %d in all",
		sum, nodes, conflicts, requests(t, stderr, "DELETE"))

	switch {
	case sum["POST"] != nodes:
		t.Errorf("%d POSTs in the node steps, want one probe pod a node (%d)", sum["POST"], nodes)
	case conflicts < 0:
		t.Errorf("%d PATCHes, want one verified marker a node (%d)", sum["PATCH"], nodes)
	case sum["WATCH"] != 0 || sum["LIST"] != 0:
		t.Errorf("the node steps watched or listed (%v): one probe watch serves every proof", sum)
	case sum["GET"] > 1+conflicts: // the probe namespace, once; a read after each lost patch
		t.Errorf("the node steps made %d GETs (%d patches lost): their guards read the run's Node watch", sum["GET"], conflicts)
	}

	// The Talos write's guard asks the machine its name and reads its configs, and the write
	// builds on that read (it read them again before: 2 Lists a node); a live write is not read
	// back — the runtime's start is asked right before it, the nodes writing at once together
	// (one ServiceList here), and the proof's read of the active config is its read-back (it was
	// a Get a node before: 2).
	configure := stepCounts(t, stderr, "configure", "Talos")
	if configure["List"] != nodes || configure["Get"] != nodes || configure["ApplyConfiguration"] != nodes || configure["ServiceList"] > nodes {
		t.Errorf("the Talos write made Talos calls %v for %d nodes: want a node 1 List (the guard's read, built on), 1 Get (its name), 1 write, "+
			"and the runtime's start before it asked with the others'", configure, nodes)
	}

	// Waiting for the runtime's restart (1 s after the write, on the sandbox) polls only the
	// runtime's start — the nodes waiting at once with one one-to-many call a poll (3 for the
	// six here; 16 when each polled alone, measured with no moment to gather: its restart a
	// second away, a poll each 500 ms). A loaded machine can spread the wave's writes so that
	// each node first asks after its runtime restarted: one call each, still no more polls than
	// nodes.
	restart := stepCounts(t, stderr, "restart", "Talos")
	if restart["List"] != 0 || restart["Get"] != 0 || restart["ServiceList"] == 0 || restart["ServiceList"] > nodes {
		t.Errorf("waiting for the runtimes' restart made Talos calls %v for %d nodes: want no config read, and no more polls than nodes (shared)", restart, nodes)
	}

	prove := stepCounts(t, stderr, "prove", "Talos")
	t.Logf("the live path's Talos calls by step, %d nodes: configure %v, restart %v, prove %v", nodes, configure, restart, prove)

	// The fleet did not change during the run: each of the run's two passes for late nodes
	// lists it once (the listing before is the plan's, then the first pass's), not twice, and
	// asks no machine: the six rotated were read by their proofs after their writes, the
	// others' facts, their Node, boot and address unchanged, are reused — as the root's
	// judgement reuses them all (the passes read the six again before: 6). The verdict reads
	// every machine's configs once, always fresh: the yardstick; it asks a machine its name
	// only when its Node, boot or address changed since it last said it (9 Gets before).
	late, root, verdict := stepCounts(t, stderr, "run: late", "Talos"), stepCounts(t, stderr, "run: root", "Talos"), stepCounts(t, stderr, "run: verdict", "Talos")
	if late["List"] != 0 || late["Get"] != 0 || root["List"] != 0 || root["Get"] != 0 {
		t.Errorf("the late-node passes (%v) or the root's judgement (%v) asked the machines again, though each was read since its last write", late, root)
	}

	machines := len(sb.Fleet().Machines())
	if verdict["List"] != machines || verdict["Get"] != 0 {
		t.Errorf("the verdict made Talos calls %v: want every one of the %d machines' configs read once, no name asked again", verdict, machines)
	}

	// What a live node costs in Talos calls at any scale: its own steps, and its share of the
	// run's whole-fleet reads (the passes' and the root's, the verdict's a machine). 9½ before
	// this (configure 4, restart ½, prove 1, a relist's 2, the verdict's 2); the bound 6.
	own := 0
	for _, m := range []map[string]int{configure, restart, prove, late, root} {
		for _, v := range m {
			own += v
		}
	}

	share := 0
	for _, v := range verdict {
		share += v
	}

	if perNode := float64(own)/float64(nodes) + float64(share)/float64(machines); perNode > 6 {
		t.Errorf("a live node costs %.1f Talos calls (its steps and the passes %d for %d nodes, the verdict %d for %d machines): want at most 6", perNode, own, nodes, share, machines)
	} else {
		t.Logf("a live node costs %.1f Talos calls", perNode)
	}

	if d := requests(t, stderr, "DELETE"); d >= nodes {
		t.Errorf("%d DELETEs for %d probe pods: finished probes' pods go a batch per request", d, nodes)
	}

	// No Event of their own; the Lease's release Event counts them.
	events, err := sb.Kube().CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	counted := false

	for _, ev := range events.Items {
		if ev.Source.Component != "ghcrsync" {
			continue
		}

		if ev.InvolvedObject.Kind == "Node" && slices.Contains(liveNodes, ev.InvolvedObject.Name) {
			t.Errorf("a node rotated live has an Event of its own: %s %s", ev.Reason, ev.Message)
		}

		if ev.Reason == "GhcrsyncLeaseReleased" && strings.Contains(ev.Message, fmt.Sprintf("%d node(s) rotated live", nodes)) {
			counted = true
		}
	}

	if !counted {
		t.Errorf("no GhcrsyncLeaseReleased Event counts the %d nodes rotated live", nodes)
	}
}

// plan reads each machine once: its name and configs together, and the dry run of the change
// builds on the configs that read returned instead of reading them again (4 Talos calls a node
// before, at 1,001 nodes 2,002 Lists).
func TestAPlanReadsEachMachineOnce(t *testing.T) {
	sb := sandboxtest.Get(t)

	if _, err := sb.RotateSecret("apiload-plan"); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := sandboxtest.Run(t, sb, "plan", "--verbose", "--config", sb.Path(sandbox.ConfigFile))
	if code != 0 {
		t.Fatalf("plan: exit %d\n%s\n%s", code, stdout, stderr)
	}

	var talos map[string]int

	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "Requests: Kubernetes") {
			talos = sideCounts(l, "Talos")
		}
	}

	t.Logf("plan's Talos calls: %v", talos)

	switch {
	case talos["ApplyConfiguration"] == 0:
		t.Fatalf("plan made no dry run (%v): nothing to compare with", talos)
	case talos["Get"] == 0 || talos["List"] != talos["Get"]:
		t.Errorf("plan listed machine configs %d times for %d machines read (%v): the dry runs build on the first read", talos["List"], talos["Get"], talos)
	}
}
