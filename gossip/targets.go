package gossip

import (
	"cmp"
	"slices"

	"github.com/cespare/xxhash/v2"
	"github.com/warmfleet/warmfleet/spec"
)

// Targets returns the names of the members that must hold s, sorted.
//
// Eligible members have role node, are alive or suspect (a suspect member
// usually comes back; moving its assignments on every missed probe would
// start downloads of hundreds of GB for nothing; Node.Members never reports
// suspect today, memberlist does not expose it) and carry every label of the
// spec's selector. A member whose inventory has not arrived yet has no
// labels, so selectors skip it until it does. When s.Targets.Nodes > 0 only that many are kept: the
// highest rendezvous scores hash(spec key, node name), so every node picks
// the same set without talking, and removing a member moves only the specs
// it held.
func Targets(s spec.Spec, members []Member) []string {
	type scored struct {
		name  string
		score uint64
	}
	key := s.Key()
	var elig []scored
	seen := map[string]bool{}
	for _, m := range members {
		if m.Role != RoleNode || !m.State.member() || seen[m.Name] {
			continue
		}
		if !s.Targets.Matches(m.Labels) {
			continue
		}
		seen[m.Name] = true
		elig = append(elig, scored{m.Name, rendezvous(key, m.Name)})
	}
	if n := s.Targets.Nodes; n > 0 && n < len(elig) {
		slices.SortFunc(elig, func(a, b scored) int {
			if c := cmp.Compare(b.score, a.score); c != 0 {
				return c
			}
			return cmp.Compare(a.name, b.name)
		})
		elig = elig[:n]
	}
	out := make([]string, len(elig))
	for i, e := range elig {
		out[i] = e.name
	}
	slices.Sort(out)
	return out
}

func rendezvous(key, node string) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString(key)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(node)
	return d.Sum64()
}
