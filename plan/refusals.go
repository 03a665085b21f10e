package plan

// writeRefusals warns of every write the API server refused in a server-side dry run of exactly
// apply's write (the snapshot's WriteRefused): apply will fail it, and hold the root back.
func writeRefusals(p *Plan) []string {
	var out []string

	for _, sp := range p.Secrets {
		if sp.WriteRefused != "" && (sp.Action == SecretCreate || sp.Action == SecretUpdate) {
			out = append(out, "The API server refused a dry run of apply's "+string(sp.Action)+" of pull secret "+sp.Namespace+"/"+sp.Secret+" ("+sp.Role+"): "+
				sp.WriteRefused+"; apply will fail that write and hold the root back: read the answer with a server-side dry run of your own (kubectl apply --dry-run=server), "+
				"then fix the policy that refuses it, or leave the namespace out of the consumers")
		}
	}

	seen := map[string]bool{}

	for _, t := range p.Templates {
		if key := TemplateRef(t.Namespace, t.Secret, t.Key); t.WriteRefused != "" && t.Action == TemplateUpdate && !seen[key] {
			seen[key] = true
			out = append(out, "The API server refused a dry run of apply's rewrite of node template "+key+": "+t.WriteRefused+
				"; apply will fail that write, and machines created later keep the old credential: fix the policy that refuses it")
		}
	}

	return out
}

// RefusedWrites counts the writes the API server refused in the plan's dry runs (plan --strict
// refuses a plan with any).
func (p *Plan) RefusedWrites() int {
	n := 0

	for _, sp := range p.Secrets {
		if sp.WriteRefused != "" && (sp.Action == SecretCreate || sp.Action == SecretUpdate) {
			n++
		}
	}

	for _, t := range p.Templates {
		if t.WriteRefused != "" && t.Action == TemplateUpdate {
			n++
		}
	}

	return n
}
