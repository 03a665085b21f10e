package plan

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// EtcdView is what one control plane's etcd member says: the members (learners marked), the
// alarms raised on the cluster, its own status errors. Err is set when it could not be read.
type EtcdView struct {
	Members []EtcdMember
	Alarms  []string
	Errors  []string
	Learner bool
	Err     string
}

// EtcdMember is one etcd member.
type EtcdMember struct {
	Hostname string
	Learner  bool
}

// ControlPlane is a control-plane Node as the quorum gate sees it.
type ControlPlane struct {
	Name          string
	Ready         bool
	Unschedulable bool
	Owner         string // a ghcrsync fence on it (any run's)
	Etcd          EtcdView
}

// MinOtherVoters is how many other healthy voting members a control plane's reboot or live
// update needs: with fewer, one more failure loses etcd's quorum.
const MinOtherVoters = 2

// ErrTooFewVoters is a gate that holds because the cluster has too few voting members, every one
// healthy: no wait changes that (nodes.allow_quorum_loss does).
var ErrTooFewVoters = errors.New("too few etcd voters")

// Quorum is the etcd gate before a control plane (self) is claimed, rebooted or updated live:
// every other voting member is healthy — its Node Ready, not cordoned and fenced by no one, its
// member answering with no errors and not a learner — no alarm is raised (NOSPACE, CORRUPT), and
// at least MinOtherVoters such members remain; a cluster with fewer voting members needs
// allowLoss (nodes.allow_quorum_loss). nil lets it through; the error says what holds it.
func Quorum(self string, cps []ControlPlane, allowLoss bool) error {
	var down, alarms, learners []string

	healthy := 0

	for _, cp := range cps {
		alarms = append(alarms, cp.Etcd.Alarms...)

		for _, m := range cp.Etcd.Members {
			if m.Learner && m.Hostname != self {
				learners = append(learners, m.Hostname)
			}
		}

		if cp.Name == self {
			continue
		}

		switch {
		case !cp.Ready:
			down = append(down, cp.Name+" is not Ready")
		case cp.Unschedulable:
			down = append(down, cp.Name+" is cordoned")
		case cp.Owner != "":
			down = append(down, cp.Name+" is fenced by run "+cp.Owner)
		case cp.Etcd.Err != "":
			down = append(down, cp.Name+"'s etcd member cannot be read ("+cp.Etcd.Err+")")
		case len(cp.Etcd.Errors) > 0:
			down = append(down, cp.Name+"'s etcd member reports errors: "+strings.Join(cp.Etcd.Errors, "; "))
		case cp.Etcd.Learner:
			// a learner votes in nothing: it is named below with the others
		default:
			healthy++
		}
	}

	slices.Sort(learners)
	learners = slices.Compact(learners)
	slices.Sort(alarms)
	alarms = slices.Compact(alarms)

	switch {
	case len(alarms) > 0:
		return fmt.Errorf("etcd has alarms raised (%s): no control plane is taken down until they are disarmed", strings.Join(alarms, ", "))
	case len(learners) > 0:
		return fmt.Errorf("etcd member(s) %s are learners, not voters: no control plane is taken down until they are promoted or removed", strings.Join(learners, ", "))
	case len(down) > 0:
		return fmt.Errorf("not every other control plane is healthy: %s", strings.Join(down, "; "))
	case healthy < MinOtherVoters && !allowLoss:
		return fmt.Errorf("%w: only %d other voting etcd member(s), all healthy: taking %s down leaves no room for another failure; "+
			"set nodes.allow_quorum_loss = true to rotate control planes anyway", ErrTooFewVoters, healthy, self)
	}

	return nil
}
