package plan

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// probeArchWarnings name the nodes the runtime probe will run on whose architecture a probe
// image does not offer: a mixed arm64/amd64 fleet needs a multi-arch probe image, or the proof
// fails to pull on the other nodes — a failure that reads as a credential problem and holds the
// node. Nothing is said of an image whose platforms are not known, nor of a node whose
// architecture is not.
func probeArchWarnings(p *Plan, s Snapshot) []string {
	arch := map[string]string{}
	for _, n := range s.Nodes {
		arch[n.Name] = n.Arch
	}

	var w []string

	for _, img := range p.Probe.Pulls() {
		offered := p.Probe.Platforms[img]
		if len(offered) == 0 {
			continue
		}

		missing := map[string][]string{} // arch -> nodes

		for _, n := range p.Nodes {
			a := arch[n.Name]
			if !n.Action.Acts() || a == "" || offersArch(offered, a) {
				continue
			}

			missing[a] = append(missing[a], n.Name)
		}

		for _, a := range slices.Sorted(maps.Keys(missing)) {
			w = append(w, fmt.Sprintf("The runtime probe's image %s offers %s only; %s %s %s: the probe cannot run there, "+
				"so the proof would fail and hold the node. Publish the probe image for every architecture of the fleet (a multi-arch "+
				"index: docker buildx build --platform linux/amd64,linux/arm64), then plan again.",
				img, strings.Join(offered, ", "), describeNames(missing[a]), isAre(len(missing[a])), "linux/"+a))
		}
	}

	return w
}

// offersArch reports whether a platform of offered (os/arch[/variant]) runs on a Linux node of
// arch.
func offersArch(offered []string, arch string) bool {
	for _, o := range offered {
		parts := strings.Split(o, "/")
		if len(parts) >= 2 && parts[0] == "linux" && parts[1] == arch {
			return true
		}
	}

	return false
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}

	return "are"
}
