package plan

import (
	"fmt"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/human"
)

// TemplateObs is one observed machine config of a node template: the Secret key's config, or
// one hcloud pool's.
type TemplateObs struct {
	Name      string `json:"name"` // the node_template block
	Namespace string `json:"namespace"`
	Secret    string `json:"secret"`
	Key       string `json:"key"`
	Format    string `json:"format"`
	Pool      string `json:"pool,omitempty"`
	// Form is how the config carries the credential (nodetemplate.Form*).
	Form   string `json:"form"`
	Digest string `json:"digest,omitempty"` // authdigest of its credential for the registry
	// Restart is the deployment rolled after a write (node_template.restart_deployment).
	Restart string `json:"restart,omitempty"`
	// WrittenAt is when the Secret's data last changed (the apiserver's managedFields time).
	WrittenAt time.Time `json:"written_at,omitzero"`
	// Reader is the Restart deployment as found (nil: none configured).
	Reader *ReaderObs `json:"reader,omitempty"`
	// Foreign is the controller that owns the Secret (a Flux or Helm label, an ownerReference);
	// Writers the other field managers of its key.
	Foreign string   `json:"foreign,omitempty"`
	Writers []Writer `json:"writers,omitempty"`
	// WriteRefused is the API server's refusal of a dry run of apply's rewrite of its key.
	WriteRefused string `json:"write_refused,omitempty"`
	// OutsidePools: a pool of the template that node_template.pools does not name. Its machines
	// boot from it all the same: it is judged, never written.
	OutsidePools bool `json:"outside_pools,omitempty"`
}

// ReaderObs is the deployment that reads a template once, when its pods start.
type ReaderObs struct {
	Missing bool `json:"missing,omitempty"`
	// StartedFrom is when the oldest of its running pods was created (the apiserver's time): the
	// last moment any of them read the template.
	StartedFrom time.Time `json:"started_from,omitzero"`
	// Idle: no pod of it runs, so none holds a template read before.
	Idle bool `json:"idle,omitempty"`
	// RolledOut: every replica runs that pod template.
	RolledOut bool `json:"rolled_out"`
}

// ReadsOnce reports whether the template's reader decodes it only when it starts: the Hetzner
// cluster-autoscaler reads HCLOUD_CLUSTER_CONFIG from its environment.
func (t TemplateObs) ReadsOnce() bool { return t.Format == "hcloud-cluster-config" }

// StaleReader says why machines created now may not boot from the template as it is; "" when
// they do (its format is read at every use, or its reader restarted since it was written).
func (t TemplateObs) StaleReader() string {
	why, _ := t.staleReader()

	return why
}

// RollingOut reports whether the template holds authDigest and its one objection is that its
// reader, restarted since the template was written, is still rolling out (a restart under way, a
// drain that evicted its pod): what waiting for the rollout ends.
func (t TemplateObs) RollingOut(authDigest string) bool {
	_, rolling := t.staleReader()

	return rolling && t.Digest == authDigest
}

// staleReader is StaleReader's judgement; rolling is true when the reader's rollout is all it
// waits for.
func (t TemplateObs) staleReader() (why string, rolling bool) {
	switch {
	case !t.ReadsOnce():
		return "", false
	case t.Restart == "":
		return "the Hetzner cluster-autoscaler reads it only when it starts and no restart_deployment restarts it, so machines it creates may still boot from the template it read before", false
	case t.Reader == nil || t.Reader.Missing:
		return "deployment " + t.Restart + ", which reads it when it starts, does not exist", false
	case t.Reader.Idle:
		return "", false
	case t.Reader.StartedFrom.Before(t.WrittenAt):
		return fmt.Sprintf("deployment %s, which reads it only when it starts, has a pod running since %s, before it was written at %s: machines it creates boot from the template it read before",
			t.Restart, t.Reader.StartedFrom.UTC().Format(time.RFC3339), t.WrittenAt.UTC().Format(time.RFC3339)), false
	case !t.Reader.RolledOut:
		return "deployment " + t.Restart + " is still rolling out: its old pods, which read the template before, may still create machines", true
	}

	return "", false
}

// ReadersRollingOut are the templates holding authDigest whose reader is still rolling out
// (TemplateObs.RollingOut).
func (s Snapshot) ReadersRollingOut(authDigest string) []TemplateObs {
	var out []TemplateObs

	for _, t := range s.Templates {
		if t.RollingOut(authDigest) {
			out = append(out, t)
		}
	}

	return out
}

// TemplateRef names a node template's Secret key, "namespace/secret[key]": in messages, and as
// the key a dry run's answer is filed under.
func TemplateRef(namespace, secret, key string) string {
	return namespace + "/" + secret + "[" + key + "]"
}

// Where names the template's Secret key (and pool) for messages.
func (t TemplateObs) Where() string {
	w := TemplateRef(t.Namespace, t.Secret, t.Key)
	if t.Pool != "" {
		w += " pool " + t.Pool
	}

	return w
}

// TemplateAction is what the plan does to a template.
type TemplateAction string

// Template actions.
const (
	TemplateUpdate TemplateAction = "update"
	// TemplateRestart: it carries the credential, but its reader has not restarted since it
	// changed: apply restarts it (restart_deployment) without writing the template.
	TemplateRestart TemplateAction = "restart"
	TemplateNoOp    TemplateAction = "no-op"
	// TemplateLeave: a pool outside node_template.pools, not on the credential: not written.
	TemplateLeave TemplateAction = "leave"
)

// TemplatePlan is one template config's action.
type TemplatePlan struct {
	TemplateObs

	Action TemplateAction `json:"action"`
	Reason string         `json:"reason"`
}

// planTemplates decides each template config's action: update unless it already carries the
// desired credential (the same digest rule as a node's machine config).
func planTemplates(obs []TemplateObs, authDigest string) []TemplatePlan {
	out := make([]TemplatePlan, 0, len(obs))

	for _, t := range obs {
		tp := TemplatePlan{TemplateObs: t, Action: TemplateUpdate}

		switch {
		case t.OutsidePools && t.Digest != authDigest:
			tp.Action, tp.Reason = TemplateLeave, fmt.Sprintf("pool %s is not in node_template %q pools: not written, though machines created from it "+
				"join with another credential (%s)", t.Pool, t.Name, human.ShortOrNone(t.Digest))
		case t.Digest == authDigest && t.Restart != "" && t.StaleReader() != "" && t.Reader != nil && !t.Reader.Missing:
			tp.Action, tp.Reason = TemplateRestart, "it carries the desired credential, but "+t.StaleReader()+"; apply restarts it"
		case t.Digest == authDigest:
			tp.Action, tp.Reason = TemplateNoOp, "machines created from it already join with the desired credential (auth digest "+human.Short(authDigest)+")"
		case t.Digest == "":
			tp.Reason = "it carries no credential for the registry: a RegistryAuthConfig document is added; machines created from it would join without one"
		default:
			tp.Reason = fmt.Sprintf("it carries another credential (%s): machines created from it would join with that one", human.Short(t.Digest))
		}

		out = append(out, tp)
	}

	return out
}

// noTemplateWarning is the plan's warning when no node_template is configured.
// staleReaderWarnings: the Hetzner cluster-autoscaler decodes HCLOUD_CLUSTER_CONFIG once, when
// it starts; a rewritten template changes no machine it creates until it restarts.
func staleReaderWarnings(tps []TemplatePlan) []string {
	var (
		w    []string
		seen = map[string]bool{}
	)

	for _, t := range tps {
		if t.Action == TemplateUpdate && t.Format == "hcloud-cluster-config" && t.Restart == "" && !seen[t.Name] {
			seen[t.Name] = true
			w = append(w, fmt.Sprintf("Node template %s/%s[%s]: the Hetzner cluster-autoscaler reads it once, when it starts, so machines it creates keep "+
				"booting with the old credential until it restarts; set node_template %q restart_deployment (e.g. \"kube-system/cluster-autoscaler\") "+
				"so apply restarts it after the write.", t.Namespace, t.Secret, t.Key, t.Name))
		}
	}

	return w
}

const noTemplateWarning = "No node_template is configured: machines the autoscaler creates later join with whatever " +
	"credential their template holds (docs/node-templates.md)."
