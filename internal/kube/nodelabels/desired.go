package nodelabels

import (
	"encoding/json"
	"fmt"
	"maps"
)

// State is what is ready on this node. Only items complete at the revision
// the fleet currently wants belong here: a cache whose new revision is still
// downloading is left out, so its label goes until the new revision is ready.
type State struct {
	// Models maps a ready model cache's name to its revision id.
	Models map[string]string
	// Images maps a ready image reference to its digest.
	Images map[string]string
	// FailedModels and FailedImages map what failed to its error; they
	// only feed Events, never labels.
	FailedModels map[string]string
	FailedImages map[string]string
}

func (s State) clone() State {
	return State{Models: maps.Clone(s.Models), Images: maps.Clone(s.Images),
		FailedModels: maps.Clone(s.FailedModels), FailedImages: maps.Clone(s.FailedImages)}
}

// Meta is the warmfleet-owned part of a Node's metadata.
type Meta struct {
	Labels      map[string]string
	Annotations map[string]string
}

// Desired is the metadata a node with this state should carry: one label
// per ready item (value "ready") and an annotation under the same key
// holding its revision id or digest.
func Desired(s State) Meta {
	m := Meta{Labels: map[string]string{}, Annotations: map[string]string{}}
	for name, rev := range s.Models {
		k := ModelKey(name)
		m.Labels[k], m.Annotations[k] = ReadyValue, rev
	}
	for ref, digest := range s.Images {
		k := ImageKey(ref)
		m.Labels[k], m.Annotations[k] = ReadyValue, digest
	}
	return m
}

// Patch returns the JSON merge patch (RFC 7386) that takes a Node whose
// metadata holds labels and annotations to the desired warmfleet metadata,
// or nil when nothing needs to change. The patch names only owned keys: it
// sets the desired ones that differ and deletes (null) owned keys that are
// no longer desired. Other owners' keys never appear in it, so a patch
// racing with another writer cannot undo that writer's change.
func Patch(labels, annotations map[string]string, want Meta) ([]byte, error) {
	lp := diff(labels, want.Labels)
	ap := diff(annotations, want.Annotations)
	if len(lp) == 0 && len(ap) == 0 {
		return nil, nil
	}
	type metadata struct {
		Labels      map[string]*string `json:"labels,omitempty"`
		Annotations map[string]*string `json:"annotations,omitempty"`
	}
	b, err := json.Marshal(struct {
		Metadata metadata `json:"metadata"`
	}{metadata{lp, ap}})
	if err != nil {
		return nil, fmt.Errorf("node patch: %w", err)
	}
	return b, nil
}

// diff maps each owned key to change to its new value, nil to delete it.
func diff(have, want map[string]string) map[string]*string {
	out := map[string]*string{}
	for k, v := range want {
		if !Owned(k) {
			continue
		}
		if got, ok := have[k]; !ok || got != v {
			out[k] = &v
		}
	}
	for k := range have {
		if _, ok := want[k]; Owned(k) && !ok {
			out[k] = nil
		}
	}
	return out
}
