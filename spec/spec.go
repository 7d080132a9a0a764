// Package spec defines what the fleet is asked to cache: model weight caches
// and container image caches, with the nodes that must hold each. Specs come
// from outside (CLI, API bodies, gossip), so Validate is strict.
package spec

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Kind tells what a spec caches.
type Kind string

// The kinds of cache.
const (
	KindModel Kind = "model"
	KindImage Kind = "image"
)

// Targets says which nodes must hold a cache. The zero value means every node.
type Targets struct {
	// Selector keeps only nodes whose labels include every pair.
	Selector map[string]string `json:"selector,omitempty"`
	// Nodes, when > 0, keeps only that many of the eligible nodes, chosen by
	// rendezvous hashing so every node agrees without coordination.
	Nodes int `json:"nodes,omitempty"`
}

// Spec is one desired cache.
type Spec struct {
	Kind Kind `json:"kind"`
	// Name is the model name (for example "llama-3-8b" or "meta/llama-3-8b")
	// or the image reference.
	Name string `json:"name"`
	// Source is where a model's files are: s3://bucket/prefix/ or
	// hf://org/model[@revision][/subdir] (a Hugging Face Hub repository),
	// or a BitTorrent magnet or .torrent file (see TorrentSource).
	Source string `json:"source,omitempty"`
	// Revision is an optional user label for a model revision.
	Revision string `json:"revision,omitempty"`
	// Include keeps only a model's files that match one of these patterns;
	// Exclude then drops those matching one of its own (see Keeps).
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	// Owner names the deployment that wants an image; several owners share it.
	Owner   string  `json:"owner,omitempty"`
	Targets Targets `json:"targets,omitzero"`
	// Pin keeps a model cache on its nodes: it is never evicted to make
	// room for another.
	Pin bool `json:"pin,omitempty"`
	// Priority ranks model caches for eviction: a cache may evict only
	// caches of its priority or lower, lowest first.
	Priority int `json:"priority,omitempty"`
	// AppliedBy names the source that applied the spec (warmfleet apply
	// -f, the daemon's --apply-dir); empty for a spec made by hand. Only
	// that source may change or prune it.
	AppliedBy string `json:"applied_by,omitempty"`
}

// Key identifies a spec in the desired state: one model cache per name, one
// image claim per (reference, owner).
func (s Spec) Key() string {
	if s.Kind == KindImage {
		return "image/" + s.Name + "#" + s.Owner
	}
	return string(s.Kind) + "/" + s.Name
}

// Equal reports whether two specs ask for the same thing.
func (s Spec) Equal(o Spec) bool {
	return s.Kind == o.Kind && s.Name == o.Name && s.Source == o.Source && s.Revision == o.Revision &&
		slices.Equal(s.Include, o.Include) && slices.Equal(s.Exclude, o.Exclude) &&
		s.Owner == o.Owner && s.Targets.Nodes == o.Targets.Nodes && maps.Equal(s.Targets.Selector, o.Targets.Selector) &&
		s.Pin == o.Pin && s.Priority == o.Priority && s.AppliedBy == o.AppliedBy
}

// Limits of a spec's capacity settings and of its applier's name (it
// travels with the spec in gossip).
const (
	MaxPriority     = 1000
	MaxAppliedByLen = 256
)

// ValidateAppliedBy checks the name of an applying source: 1 to
// MaxAppliedByLen printable UTF-8 bytes.
func ValidateAppliedBy(owner string) error {
	if owner == "" || len(owner) > MaxAppliedByLen || !utf8.ValidString(owner) || strings.ContainsFunc(owner, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("owner %q: want 1 to %d printable UTF-8 bytes", owner, MaxAppliedByLen)
	}
	return nil
}

var (
	modelNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99})?$`)
	revisionRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	ownerRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$`)
	labelKeyRE  = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?$`)
	labelValRE  = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$`)
	imageRefRE  = regexp.MustCompile(`^[a-z0-9]([a-z0-9._:/@-]{0,510}[A-Za-z0-9_])?$`)
)

// MaxSelectorLabels bounds a selector so a spec stays small on the wire.
const MaxSelectorLabels = 8

// Validate reports every problem with the spec.
func (s Spec) Validate() error {
	var errs []error
	switch s.Kind {
	case KindModel:
		errs = append(errs, ValidateModelName(s.Name))
		if s.Source == "" {
			errs = append(errs, errors.New("model source is required (s3://bucket/prefix/, hf://org/model[@revision][/subdir], magnet:?xt=urn:btih:... or torrent+https://.../x.torrent)"))
		} else if err := ValidateSource(s.Source); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, ValidatePatterns("include", s.Include), ValidatePatterns("exclude", s.Exclude))
		if s.Revision != "" && !revisionRE.MatchString(s.Revision) {
			errs = append(errs, fmt.Errorf("revision %q: want letters, digits, '.', '_', '-' (at most 64)", s.Revision))
		}
		if s.Owner != "" {
			errs = append(errs, errors.New("owner applies to images only"))
		}
	case KindImage:
		if !imageRefRE.MatchString(s.Name) {
			errs = append(errs, fmt.Errorf("image reference %q is not valid", s.Name))
		}
		if !ownerRE.MatchString(s.Owner) {
			errs = append(errs, fmt.Errorf("owner %q: want letters, digits, '.', '_', '/', '-'", s.Owner))
		}
		if s.Source != "" || s.Revision != "" || len(s.Include) > 0 || len(s.Exclude) > 0 || s.Pin || s.Priority != 0 {
			errs = append(errs, errors.New("source, revision, include, exclude, pin and priority apply to models only"))
		}
	default:
		errs = append(errs, fmt.Errorf("kind %q: want %q or %q", s.Kind, KindModel, KindImage))
	}
	if s.Priority < -MaxPriority || s.Priority > MaxPriority {
		errs = append(errs, fmt.Errorf("priority %d: want %d..%d", s.Priority, -MaxPriority, MaxPriority))
	}
	if s.AppliedBy != "" {
		errs = append(errs, ValidateAppliedBy(s.AppliedBy))
	}
	errs = append(errs, s.Targets.validate())
	return errors.Join(errs...)
}

func (t Targets) validate() error {
	var errs []error
	if t.Nodes < 0 {
		errs = append(errs, fmt.Errorf("nodes %d: want >= 0 (0 means all eligible nodes)", t.Nodes))
	}
	if len(t.Selector) > MaxSelectorLabels {
		errs = append(errs, fmt.Errorf("selector has %d labels, at most %d", len(t.Selector), MaxSelectorLabels))
	}
	for _, k := range slices.Sorted(maps.Keys(t.Selector)) {
		if err := ValidateLabel(k, t.Selector[k]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ValidateModelName checks a model name: "model" or "org/model".
func ValidateModelName(name string) error {
	if !modelNameRE.MatchString(name) || strings.Contains(name, "..") || strings.Contains(name, "--") {
		return fmt.Errorf("model name %q: want letters, digits, '.', '_', '-', at most one '/', no '..' or '--'", name)
	}
	return nil
}

// ValidateLabel checks one node label or selector pair.
func ValidateLabel(k, v string) error {
	if !labelKeyRE.MatchString(k) {
		return fmt.Errorf("label key %q: want letters, digits, '.', '_', '/', '-' (at most 64)", k)
	}
	if !labelValRE.MatchString(v) {
		return fmt.Errorf("label %q value %q: want letters, digits, '.', '_', '-' (at most 63)", k, v)
	}
	return nil
}

// ParseLabels parses "k=v" pairs (from repeated --label or --selector flags).
func ParseLabels(pairs []string) (map[string]string, error) {
	out := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("label %q: want key=value", p)
		}
		if err := ValidateLabel(k, v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// Matches reports whether labels satisfy the selector.
func (t Targets) Matches(labels map[string]string) bool {
	for k, v := range t.Selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
