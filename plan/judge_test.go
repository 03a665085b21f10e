package plan_test

import (
	"fmt"
	goldenfile "github.com/ghcrsync/ghcrsync/internal/golden"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// judgeCase is one block of testdata/judge/*.txt:
//
//	case NAME
//	planned uid=u1 boot=b1 digest=D taint=KEY[=VALUE]:EFFECT cordoned   (absent: planning)
//	node    uid=u1 boot=b1 ready cordoned deleting owner=H phase=P taint=... active=D | absent
//	at      phase=P action=A step=S holder=H desired=D policy=P
//	=> DECISION REASON: MESSAGE                                          (rewritten by -update)
type judgeCase struct {
	block   goldenfile.Case
	subject plan.Subject
	want    string
}

func TestJudge(t *testing.T) {
	files, _ := filepath.Glob("testdata/judge/*.txt")
	if len(files) == 0 {
		t.Fatal("no testdata/judge/*.txt")
	}

	seen := map[string]bool{}

	for _, file := range files {
		cases, header := readJudgeCases(t, file)
		blocks, rendered := make([]goldenfile.Case, 0, len(cases)), make([][]string, 0, len(cases))

		for _, c := range cases {
			v := plan.Judge(c.subject)
			got := render(v, c.subject)

			if !goldenfile.Updating() && got != c.want {
				t.Errorf("%s: case %s:\n got: %s\nwant: %s", c.block.At(), c.block.Name, got, c.want)
			}

			seen["decision "+string(v.Decision)] = true
			seen["reason "+string(v.Reason)] = true
			seen["phase "+string(c.subject.Phase)] = true
			seen["step "+string(c.subject.Step)] = true

			c.block.Inline = true
			blocks, rendered = append(blocks, c.block), append(rendered, []string{got})
		}

		if goldenfile.Updating() {
			goldenfile.WriteCases(t, file, header, blocks, rendered)
		}
	}

	var want []string
	for _, d := range []plan.Decision{plan.Proceed, plan.Deselect, plan.Refuse, plan.Gone} {
		want = append(want, "decision "+string(d))
	}

	for _, r := range []plan.Reason{plan.ReasonAutoscalerCandidate, plan.ReasonAutoscalerDeleting, plan.ReasonDeleting,
		plan.ReasonNotFound, plan.ReasonFencedByOther, plan.ReasonNotReady, plan.ReasonRebooted, plan.ReasonCordonChanged,
		plan.ReasonTaintsChanged, plan.ReasonConfigChanged, plan.ReasonFenceRemoved, plan.ReasonNeverClaimed, plan.ReasonStagedConfig, plan.ReasonRoleChanged} {
		want = append(want, "reason "+string(r))
	}

	for _, p := range state.Phases {
		want = append(want, "phase "+string(p))
	}

	for _, s := range []plan.Step{plan.StepPlan, plan.StepClaim, plan.StepGuard, plan.StepDrain, plan.StepConfigure, plan.StepKeyring, plan.StepReboot,
		plan.StepWait, plan.StepProve, plan.StepRelease, plan.StepCheck, plan.StepAnnotate, plan.StepUndo} {
		want = append(want, "step "+string(s))
	}

	for _, w := range want {
		if !seen[w] {
			t.Errorf("no judge case covers %s", w)
		}
	}
}

func render(v plan.Verdict, s plan.Subject) string {
	if v.Decision == plan.Proceed {
		return "proceed"
	}

	return fmt.Sprintf("%s %s: %s", v.Decision, v.Reason, v.Message("n1", s.Step))
}

// readJudgeCases reads a file's cases (golden.ReadCases) and parses each into its subject.
func readJudgeCases(t *testing.T, file string) ([]judgeCase, []string) {
	t.Helper()

	header, blocks := goldenfile.ReadCases(t, file)
	cases := make([]judgeCase, 0, len(blocks))

	for _, b := range blocks {
		c := judgeCase{block: b, subject: plan.Subject{Step: plan.StepPlan}}

		for _, text := range b.Input {
			if strings.HasPrefix(text, "#") {
				continue
			}

			if err := parseJudgeLine(&c, text); err != nil {
				t.Fatalf("%s: case %s: %v", b.At(), b.Name, err)
			}
		}

		if len(b.Want) == 1 {
			c.want = b.Want[0]
		}

		cases = append(cases, c)
	}

	return cases, header
}

func parseJudgeLine(c *judgeCase, text string) error {
	fields := strings.Fields(text)
	kind, args := fields[0], fields[1:]

	switch kind {
	case "planned":
		inv := &plan.Invariants{SchedulingTaints: []string{}}
		for _, a := range args {
			k, v, _ := strings.Cut(a, "=")
			switch k {
			case "uid":
				inv.UID = v
			case "boot":
				inv.BootID = v
			case "digest":
				inv.ConfiguredDigest = v
			case "cordoned":
				inv.Unschedulable = true
			case "control-plane":
				inv.ControlPlane = true
			case "taint":
				inv.SchedulingTaints = taints.Scheduling(append(parseTaints(inv.SchedulingTaints), parseTaint(v)))
			default:
				return fmt.Errorf("planned: unknown %q", a)
			}
		}

		c.subject.Planned = inv
	case "node":
		if len(args) == 1 && args[0] == "absent" {
			c.subject.Node = nil

			return nil
		}

		n := &plan.Node{Name: "n1", InternalIPs: []string{"10.0.0.1"}}
		for _, a := range args {
			k, v, _ := strings.Cut(a, "=")
			switch k {
			case "uid":
				n.UID = v
			case "ips":
				n.InternalIPs = strings.Split(v, ",")
				if v == "none" {
					n.InternalIPs = nil
				}
			case "boot":
				n.BootID = v
			case "ready":
				n.Ready = true
			case "control-plane":
				n.ControlPlane = true
			case "cordoned":
				n.Unschedulable = true
			case "deleting":
				at := time.Date(2026, 11, 29, 11, 59, 0, 0, time.UTC)
				n.Deleting = &at
			case "owner":
				n.Owner = v
			case "phase":
				n.Phase = state.Phase(v)
			case "taint":
				n.Taints = append(n.Taints, parseTaint(v))
			case "active":
				if n.Talos == nil {
					n.Talos = &plan.TalosFacts{}
				}

				n.Talos.ConfiguredDigest = v
			case "staged":
				if n.Talos == nil {
					n.Talos = &plan.TalosFacts{}
				}

				n.Talos.StagedDigest, n.Talos.StagedDiffers = v, true
			default:
				return fmt.Errorf("node: unknown %q", a)
			}
		}

		c.subject.Node = n
	case "at":
		for _, a := range args {
			k, v, _ := strings.Cut(a, "=")
			switch k {
			case "phase":
				c.subject.Phase = state.Phase(v)
			case "action":
				c.subject.Action = plan.Action(v)
			case "step":
				c.subject.Step = plan.Step(strings.ReplaceAll(v, "_", " "))
			case "holder":
				c.subject.Holder = v
			case "desired":
				c.subject.Desired = v
			case "policy":
				c.subject.CandidatePolicy = v
			default:
				return fmt.Errorf("at: unknown %q", a)
			}
		}
	default:
		return fmt.Errorf("unknown line kind %q", kind)
	}

	return nil
}

// parseTaint reads KEY[=VALUE]:EFFECT.
func parseTaint(s string) taints.Taint {
	kv, effect, _ := strings.Cut(s, ":")
	k, v, _ := strings.Cut(kv, "=")

	return taints.Taint{Key: k, Value: v, Effect: effect}
}

func parseTaints(canonical []string) []taints.Taint {
	out := make([]taints.Taint, 0, len(canonical))
	for _, c := range canonical {
		out = append(out, parseTaint(c))
	}

	return out
}
