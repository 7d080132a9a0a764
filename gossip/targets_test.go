package gossip

import (
	"fmt"
	"slices"
	"testing"

	"github.com/warmfleet/warmfleet/spec"
)

func TestTargets(t *testing.T) {
	gpu := map[string]string{"gpu": "h100"}
	members := []Member{
		{Name: "a", State: MemberAlive, Role: RoleNode, Labels: gpu},
		{Name: "b", State: MemberAlive, Role: RoleNode, Labels: map[string]string{"gpu": "a10"}},
		{Name: "c", State: MemberSuspect, Role: RoleNode, Labels: gpu},
		{Name: "d", State: MemberDead, Role: RoleNode, Labels: gpu},
		{Name: "e", State: MemberLeft, Role: RoleNode, Labels: gpu},
		{Name: "r", State: MemberAlive, Role: RoleRouter, Labels: gpu},
		{Name: "x", State: MemberAlive, Role: "", Labels: gpu}, // unreadable metadata
		{Name: "f", State: MemberAlive, Role: RoleNode},        // no inventory yet: no labels
	}
	withTargets := func(sel map[string]string, n int) spec.Spec {
		s := modelSpec("m")
		s.Targets = spec.Targets{Selector: sel, Nodes: n}
		return s
	}
	for _, tc := range []struct {
		name string
		spec spec.Spec
		want []string
	}{
		{"all eligible", withTargets(nil, 0), []string{"a", "b", "c", "f"}},
		{"selector", withTargets(gpu, 0), []string{"a", "c"}},
		{"selector matches none", withTargets(map[string]string{"gpu": "b200"}, 0), []string{}},
		{"nodes above eligible", withTargets(gpu, 5), []string{"a", "c"}},
		{"one of selector", withTargets(gpu, 1), []string{rendezvousTop("model/m", []string{"a", "c"})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Targets(tc.spec, members); !slices.Equal(got, tc.want) {
				t.Fatalf("Targets = %v, want %v", got, tc.want)
			}
		})
	}
	if got := Targets(withTargets(nil, 0), nil); len(got) != 0 {
		t.Fatalf("no members: %v", got)
	}
	dup := append(slices.Clone(members), members[0])
	if got := Targets(withTargets(nil, 0), dup); !slices.Equal(got, []string{"a", "b", "c", "f"}) {
		t.Fatalf("duplicate member: %v", got)
	}
}

func rendezvousTop(key string, names []string) string {
	best, bestScore := "", uint64(0)
	for _, n := range names {
		if s := rendezvous(key, n); best == "" || s > bestScore {
			best, bestScore = n, s
		}
	}
	return best
}

// Removing a node moves only the assignments it held; adding one takes
// assignments only for itself. Assignments spread over the nodes.
func TestTargetsStableUnderMembershipChange(t *testing.T) {
	var members []Member
	for i := range 20 {
		members = append(members, Member{Name: fmt.Sprintf("node-%02d", i), State: MemberAlive, Role: RoleNode})
	}
	const specs = 500
	assign := func(ms []Member) map[string][]string {
		out := map[string][]string{}
		for i := range specs {
			s := modelSpec(fmt.Sprintf("model-%d", i))
			s.Targets.Nodes = 3
			out[s.Key()] = Targets(s, ms)
		}
		return out
	}
	before := assign(members)
	load := map[string]int{}
	for _, ns := range before {
		for _, n := range ns {
			load[n]++
		}
	}
	for name, l := range load {
		// 500*3/20 = 75 on average; rendezvous hashing keeps every node near it.
		if l < 40 || l > 110 {
			t.Errorf("%s holds %d assignments, far from the mean of 75", name, l)
		}
	}
	gone := "node-07"
	after := assign(slices.DeleteFunc(slices.Clone(members), func(m Member) bool { return m.Name == gone }))
	moved := 0
	for key, old := range before {
		nw := after[key]
		if !slices.Contains(old, gone) {
			if !slices.Equal(old, nw) {
				t.Fatalf("%s moved from %v to %v though %s did not hold it", key, old, nw, gone)
			}
			continue
		}
		kept := 0
		for _, n := range old {
			if n != gone && slices.Contains(nw, n) {
				kept++
			}
		}
		if kept != 2 || len(nw) != 3 {
			t.Fatalf("%s: %v -> %v: the other holders must stay", key, old, nw)
		}
		moved++
	}
	if moved != load[gone] {
		t.Fatalf("%d specs moved, %s held %d", moved, gone, load[gone])
	}
	added := assign(append(slices.Clone(members), Member{Name: "node-new", State: MemberAlive, Role: RoleNode}))
	for key, old := range before {
		nw := added[key]
		if slices.Equal(old, nw) {
			continue
		}
		if !slices.Contains(nw, "node-new") {
			t.Fatalf("%s changed %v -> %v without the new node", key, old, nw)
		}
	}
}
