package plan

import (
	"fmt"

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
}

// Where names the template's Secret key (and pool) for messages.
func (t TemplateObs) Where() string {
	w := t.Namespace + "/" + t.Secret + "[" + t.Key + "]"
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
	TemplateNoOp   TemplateAction = "no-op"
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
