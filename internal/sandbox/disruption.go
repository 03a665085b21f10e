package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// DemoNamespaces hold the demo workloads (createDemoWorkloads, seedFanOut): what the
// availability witness watches.
var DemoNamespaces = append([]string{"apps"}, ConsumerNamespaces...)

// podLife is what the kubelets saw of one pod: who made it, when, and how long it could not pull.
type podLife struct {
	Namespace, Name, Owner string
	// Started is when a kubelet first ran it: after the eviction of the pod it replaces (the
	// API's creation time has whole seconds only).
	Started      time.Time
	failingSince time.Time // zero while it pulls
	spells       [][2]time.Time
}

// failedSince is how long the pod could not pull after since.
func (l podLife) failedSince(since, now time.Time) time.Duration {
	var d time.Duration

	spells := l.spells
	if !l.failingSince.IsZero() {
		spells = append(slices.Clone(spells), [2]time.Time{l.failingSince, now})
	}

	for _, sp := range spells {
		from := sp[0]
		if from.Before(since) {
			from = since
		}

		if sp[1].After(from) {
			d += sp[1].Sub(from)
		}
	}

	return d
}

// notePull records a pod's pull result as its kubelet saw it: a failure opens a spell of
// ErrImagePull/ImagePullBackOff, a success closes it.
func (f *Fleet) notePull(pod *corev1.Pod, failed bool) {
	f.statsMu.Lock()
	defer f.statsMu.Unlock()

	if f.pods == nil {
		f.pods = map[string]*podLife{}
	}

	key := string(pod.UID)
	l := f.pods[key]

	if l == nil {
		l = &podLife{Namespace: pod.Namespace, Name: pod.Name, Started: time.Now().UTC()}
		if len(pod.OwnerReferences) > 0 {
			l.Owner = pod.OwnerReferences[0].Kind + "/" + pod.OwnerReferences[0].Name
		}

		f.pods[key] = l
	}

	now := time.Now()

	switch {
	case failed && l.failingSince.IsZero():
		l.failingSince = now
	case !failed && !l.failingSince.IsZero():
		l.spells = append(l.spells, [2]time.Time{l.failingSince, now})
		l.failingSince = time.Time{}
	}
}

// Disruption is what a run did to the workloads of some namespaces since an instant: every
// eviction (from the apiserver's audit log) and every pod's time unable to pull (from the
// kubelets).
type Disruption struct {
	Evictions []Eviction `json:"evictions"`
	// EvictionsPerPod are the evictions of each original pod's line (a pod, the pod its
	// controller made in its place, ...): max and mean over the lines evicted at least once.
	MaxEvictionsPerPod  int     `json:"max_evictions_per_pod"`
	MeanEvictionsPerPod float64 `json:"mean_evictions_per_pod"`
	// PullFailures are the pods that spent time unable to pull, and the total pod-seconds.
	PullFailures       []PullFailure `json:"pull_failures,omitempty"`
	PullFailurePodSecs float64       `json:"pull_failure_pod_seconds"`
}

// Eviction is one eviction request the apiserver answered (granted, or refused by a budget).
type Eviction struct {
	Pod  string    `json:"pod"`
	Time time.Time `json:"time"`
	// UserAgent is the asking client's ("ghcrsync" for ghcrsync's own requests).
	UserAgent string `json:"user_agent,omitempty"`
	// Owner and Started are the pod's controller and when a kubelet first ran it.
	Owner   string    `json:"owner,omitempty"`
	Started time.Time `json:"started"`
}

// PullFailure is one pod's time in ErrImagePull/ImagePullBackOff.
type PullFailure struct {
	Pod     string  `json:"pod"`
	Seconds float64 `json:"seconds"`
}

// Disruption reports the evictions and pull failures of pods in namespaces since since.
func (s *Sandbox) Disruption(since time.Time, namespaces []string) (Disruption, error) {
	evs, err := s.evictions(since, namespaces)
	if err != nil {
		return Disruption{}, err
	}

	d := Disruption{Evictions: evs}

	f := s.fleet
	f.statsMu.Lock()
	lives := make(map[string]podLife, len(f.pods))

	for _, l := range f.pods {
		if !slices.Contains(namespaces, l.Namespace) {
			continue
		}

		lives[l.Namespace+"/"+l.Name] = *l

		if failed := l.failedSince(since, time.Now()); failed > 0 {
			d.PullFailures = append(d.PullFailures, PullFailure{Pod: l.Namespace + "/" + l.Name, Seconds: failed.Seconds()})
			d.PullFailurePodSecs += failed.Seconds()
		}
	}
	f.statsMu.Unlock()

	for i := range d.Evictions {
		l := lives[d.Evictions[i].Pod]
		d.Evictions[i].Owner, d.Evictions[i].Started = l.Owner, l.Started
	}

	d.MaxEvictionsPerPod, d.MeanEvictionsPerPod = lines(d.Evictions, lives)

	return d, nil
}

// lines follows each eviction to the pod its controller made in its place: a pod created after
// an eviction of its owner's pod continues that pod's line. It returns the most evictions of
// one line, and the mean over the lines evicted at least once.
func lines(evs []Eviction, lives map[string]podLife) (maxN int, mean float64) {
	type line struct {
		owner     string
		evictedAt time.Time
		n         int
		taken     bool
	}

	var all []*line

	depth := map[string]*line{} // pod -> the line it belongs to

	for _, ev := range evs { // in time order
		life := lives[ev.Pod]

		l := depth[ev.Pod]
		if l == nil {
			// A pod first run after its owner's pod was evicted is that pod's replacement.
			for _, c := range all {
				if !c.taken && life.Owner != "" && c.owner == life.Owner && life.Started.After(c.evictedAt) {
					l, c.taken = c, true

					break
				}
			}
		}

		if l == nil {
			l = &line{owner: life.Owner}
			all = append(all, l)
		}

		l.n++
		l.evictedAt, l.taken = ev.Time, false
		depth[ev.Pod] = l
	}

	total := 0

	for _, l := range all {
		total += l.n
		maxN = max(maxN, l.n)
	}

	if len(all) > 0 {
		mean = float64(total) / float64(len(all))
	}

	return maxN, mean
}

// evictions reads the granted evictions of pods in namespaces since since from the audit log.
func (s *Sandbox) evictions(since time.Time, namespaces []string) ([]Eviction, error) {
	return s.evictionAnswers(since, namespaces, func(code int) bool { return code/100 == 2 })
}

// RefusedEvictions reads, from the apiserver's audit log, the eviction requests for pods in
// namespaces since since that a PodDisruptionBudget refused (429 Too Many Requests): each time
// a drain was held by a budget, as the apiserver answered it.
func (s *Sandbox) RefusedEvictions(since time.Time, namespaces []string) ([]Eviction, error) {
	return s.evictionAnswers(since, namespaces, func(code int) bool { return code == http.StatusTooManyRequests })
}

// evictionAnswers reads the eviction requests whose answer's status code answered says.
func (s *Sandbox) evictionAnswers(since time.Time, namespaces []string, answered func(code int) bool) ([]Eviction, error) {
	b, err := os.ReadFile(filepath.Join(s.opts.Dir, "logs", AuditLogFile))
	if err != nil {
		return nil, err
	}

	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		b = nil
	}

	var out []Eviction

	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `"eviction"`) {
			continue
		}

		var ev struct {
			Verb      string `json:"verb"`
			Stage     string `json:"stage"`
			ObjectRef struct {
				Namespace   string `json:"namespace"`
				Name        string `json:"name"`
				Subresource string `json:"subresource"`
			} `json:"objectRef"`
			ResponseStatus struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			StageTimestamp time.Time `json:"stageTimestamp"`
			UserAgent      string    `json:"userAgent"`
		}

		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}

		ok := ev.Verb == "create" && ev.Stage == "ResponseComplete" && ev.ObjectRef.Subresource == "eviction" && answered(ev.ResponseStatus.Code)
		if ok && slices.Contains(namespaces, ev.ObjectRef.Namespace) && ev.StageTimestamp.After(since) {
			out = append(out, Eviction{Pod: ev.ObjectRef.Namespace + "/" + ev.ObjectRef.Name, Time: ev.StageTimestamp, UserAgent: ev.UserAgent})
		}
	}

	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })

	return out, nil
}
