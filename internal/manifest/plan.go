package manifest

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/spec"
)

// Current is one thing the daemon already holds, with who applied it.
type Current struct {
	Object
	// AppliedBy is the owner that applied it; empty for what was made by
	// hand (the CLI's add commands, the API).
	AppliedBy string
}

// Action is what a plan does to one key.
type Action string

// The actions, in the order a plan lists them.
const (
	Create Action = "create"
	Update Action = "update"
	Delete Action = "delete"
)

// Change is one step of a plan.
type Change struct {
	Action Action
	Key    string
	// Old is what the daemon holds (update, delete); New what it will
	// hold (create, update).
	Old, New Object
	// OldOwner is the owner Old was applied by; an update of something
	// made by hand (OldOwner "") adopts it.
	OldOwner string
}

// Plan is what apply (or delete) will do.
type Plan struct {
	// Owner is the owner the plan applies as.
	Owner   string
	Changes []Change
	// Unchanged counts desired objects the daemon already holds as asked.
	Unchanged int
	// Missing counts, for a delete, named objects the daemon does not hold.
	Missing int
}

// ConflictError lists keys the plan would take from another owner.
type ConflictError struct {
	Verb   string
	Owners map[string]string // key -> its owner
}

func (e *ConflictError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d object(s) belong to another owner; change them through it, or delete them there first:", e.Verb, len(e.Owners))
	for _, k := range slices.Sorted(maps.Keys(e.Owners)) {
		fmt.Fprintf(&b, "\n  %s (owner %s)", k, e.Owners[k])
	}
	return b.String()
}

// MakePlan decides what applying desired as owner does to current:
//
//   - a desired object the daemon lacks is created, owned by owner;
//   - one it holds differently is updated; one made by hand is adopted
//     (updated to be owned by owner) even when equal;
//   - with prune, an object owned by owner that desired no longer names is
//     deleted; objects of other owners and hand-made ones are never pruned;
//   - a desired object another owner applied is a conflict: the plan
//     fails with a *ConflictError naming every such key and its owner.
func MakePlan(current []Current, desired []Object, owner string, prune bool) (Plan, error) {
	if err := ValidateOwner(owner); err != nil {
		return Plan{}, fmt.Errorf("plan: %w", err)
	}
	have := index(current)
	p := Plan{Owner: owner}
	conflicts := map[string]string{}
	want := map[string]bool{}
	for _, o := range desired {
		k := o.Key()
		want[k] = true
		cur, ok := have[k]
		switch {
		case !ok:
			p.Changes = append(p.Changes, Change{Action: Create, Key: k, New: o})
		case cur.AppliedBy != "" && cur.AppliedBy != owner:
			conflicts[k] = cur.AppliedBy
		case cur.AppliedBy == "" || !cur.Equal(o):
			p.Changes = append(p.Changes, Change{Action: Update, Key: k, Old: cur.Object, New: o, OldOwner: cur.AppliedBy})
		default:
			p.Unchanged++
		}
	}
	if prune {
		for _, k := range slices.Sorted(maps.Keys(have)) {
			if cur := have[k]; !want[k] && cur.AppliedBy == owner {
				p.Changes = append(p.Changes, Change{Action: Delete, Key: k, Old: cur.Object, OldOwner: owner})
			}
		}
	}
	if len(conflicts) > 0 {
		return Plan{}, &ConflictError{Verb: "apply", Owners: conflicts}
	}
	p.sort()
	return p, nil
}

// PlanDelete decides what `delete -f` does: delete each object the file
// names that the daemon holds. Objects another owner applied are refused:
// the plan fails with a *ConflictError naming them. Hand-made ones may go.
func PlanDelete(current []Current, named []Object, owner string) (Plan, error) {
	have := index(current)
	p := Plan{Owner: owner}
	conflicts := map[string]string{}
	for _, o := range named {
		k := o.Key()
		cur, ok := have[k]
		switch {
		case !ok:
			p.Missing++
		case cur.AppliedBy != "" && cur.AppliedBy != owner:
			conflicts[k] = cur.AppliedBy
		default:
			p.Changes = append(p.Changes, Change{Action: Delete, Key: k, Old: cur.Object, OldOwner: cur.AppliedBy})
		}
	}
	if len(conflicts) > 0 {
		return Plan{}, &ConflictError{Verb: "delete", Owners: conflicts}
	}
	p.sort()
	return p, nil
}

func index(current []Current) map[string]Current {
	have := make(map[string]Current, len(current))
	for _, c := range current {
		have[c.Key()] = c
	}
	return have
}

func (p *Plan) sort() {
	order := map[Action]int{Create: 0, Update: 1, Delete: 2}
	slices.SortStableFunc(p.Changes, func(a, b Change) int {
		if d := order[a.Action] - order[b.Action]; d != 0 {
			return d
		}
		return strings.Compare(a.Key, b.Key)
	})
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool { return len(p.Changes) == 0 }

// Held is a spec the daemon holds, as a plan sees it: its AppliedBy moves
// from the spec to the Current, so objects compare by what they ask.
func Held(s spec.Spec) Current {
	by := s.AppliedBy
	s.AppliedBy = ""
	return Current{Object: FromSpec(s), AppliedBy: by}
}

// HeldEndpoint is an endpoint the daemon holds, as a plan sees it.
func HeldEndpoint(ep api.Endpoint) Current {
	by := ep.AppliedBy
	ep.AppliedBy = ""
	return Current{Object: FromEndpoint(ep), AppliedBy: by}
}
