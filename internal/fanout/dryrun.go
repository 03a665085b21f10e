package fanout

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
)

// DryRun makes every write the plan's fan-out would make — each pull secret to create or update,
// each node template to rewrite — as a server-side dry run (dryRun=All: authorized, admitted and
// validated as apply's write will be, persisted nowhere), through the very compare-and-swap code
// apply runs. It returns each write's error by object ("ns/name"; a template "ns/name[key]"),
// nil for one the server admitted. The node templates are tried on templates, the client apply
// writes them with (the template identity's).
func DryRun(ctx context.Context, kube, templates kubernetes.Interface, p *plan.Plan, o secretwrite.Options) map[string]error {
	o.DryRun, o.Hooks = true, secretwrite.Hooks{}
	o.Assert = func(context.Context) error { return nil } // no Lease: nothing is written

	out := map[string]error{}

	for _, sp := range p.Secrets {
		if sp.Action == plan.SecretCreate || sp.Action == plan.SecretUpdate {
			_, err := put(ctx, kube.CoreV1().Secrets(sp.Namespace), sp, o)
			out[sp.Namespace+"/"+sp.Secret] = err
		}
	}

	for _, t := range o.Templates {
		if _, update, _ := templateActions(p, t); update {
			_, err := putTemplate(ctx, templates, t, o)
			out[plan.TemplateRef(t.Namespace, t.Secret, t.Key)] = err
		}
	}

	return out
}
