package imagecache

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/distribution/reference"
)

// Labels on containerd image records hold all of the cache's state, so it
// survives a daemon restart and is visible with `ctr images ls`.
const (
	// LabelManaged marks an image that warmfleet pulled and may remove.
	// An image that existed before warmfleet was asked for it never gets it.
	LabelManaged = "warmfleet.io/managed"
	// LabelOwnerPrefix + owner is set (to the time of the claim) for each
	// owner, on managed and foreign images alike.
	LabelOwnerPrefix = "warmfleet.io/owner."
)

// maxOwnerLen keeps an owner label key well within containerd's limit of
// 4096 bytes for a key and its value.
const maxOwnerLen = 200

// ValidateOwner checks an owner name: 1 to 200 characters of letters,
// digits and ". _ - /", starting with a letter or digit (so that
// "namespace/deployment" works). The name is used verbatim in a label key,
// which is why anything else is refused rather than rewritten: two owners
// must never map to one label.
func ValidateOwner(owner string) error {
	if owner == "" {
		return fmt.Errorf("owner: empty")
	}
	if len(owner) > maxOwnerLen {
		return fmt.Errorf("owner %.20q...: longer than %d characters", owner, maxOwnerLen)
	}
	for i := 0; i < len(owner); i++ {
		c := owner[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("owner %q: must start with a letter or digit", owner)
		}
		if !alnum && c != '.' && c != '_' && c != '-' && c != '/' {
			return fmt.Errorf("owner %q: character %q not allowed (letters, digits, . _ - /)", owner, c)
		}
	}
	return nil
}

// OwnerLabel returns the label key that records owner.
func OwnerLabel(owner string) string { return LabelOwnerPrefix + owner }

// Owners returns the owners recorded in labels, sorted. Keys with the
// prefix but an invalid owner (written by hand) are ignored.
func Owners(labels map[string]string) []string {
	var out []string
	for k := range labels {
		if o, ok := strings.CutPrefix(k, LabelOwnerPrefix); ok && ValidateOwner(o) == nil {
			out = append(out, o)
		}
	}
	slices.Sort(out)
	return out
}

// IsManaged reports whether labels mark an image warmfleet pulled.
func IsManaged(labels map[string]string) bool { return labels[LabelManaged] == "true" }

// tracked reports whether an image record is of interest to the cache.
func tracked(labels map[string]string) bool {
	return IsManaged(labels) || len(Owners(labels)) > 0
}

// pullLabels is the label set for an image record that a pull creates or
// replaces (client.Pull replaces every label). Existing labels are kept;
// the managed mark is added only to a record that did not exist, so an
// image somebody else pulled is never claimed.
func pullLabels(existing map[string]string, existed bool, owner, now string) map[string]string {
	out := maps.Clone(existing)
	if out == nil {
		out = map[string]string{}
	}
	if !existed {
		out[LabelManaged] = "true"
	}
	if _, ok := out[OwnerLabel(owner)]; !ok {
		out[OwnerLabel(owner)] = now
	}
	return out
}

// withoutOwners returns labels minus every owner label: owners hold a tag,
// not the digest it used to point at.
func withoutOwners(labels map[string]string) map[string]string {
	out := make(map[string]string, len(labels))
	for k, v := range labels {
		if !strings.HasPrefix(k, LabelOwnerPrefix) {
			out[k] = v
		}
	}
	return out
}

// DeleteDecision says whether an image record may be removed, and if not,
// why.
type DeleteDecision struct {
	Delete bool
	Reason string
}

// decideDelete is the one rule for removing an image: only one warmfleet
// pulled, that nobody owns any more and that no container uses.
func decideDelete(managed bool, owners, usedBy []string) DeleteDecision {
	switch {
	case !managed:
		return DeleteDecision{Reason: "kept: not pulled by warmfleet"}
	case len(owners) > 0:
		return DeleteDecision{Reason: "kept: still owned by " + strings.Join(owners, ", ")}
	case len(usedBy) > 0:
		return DeleteDecision{Reason: "kept: in use by container " + strings.Join(usedBy, ", ")}
	}
	return DeleteDecision{Delete: true, Reason: "removed: no owner left and no container uses it"}
}

// containerImage is what usage checks need of a container record.
type containerImage struct {
	ID    string
	Image string
}

// containersUsing returns the IDs of containers that use the image whose
// record is name with target digest. A container names its image by tag,
// by digest reference or (CRI) by the image's config digest; targetOf maps
// other image names that containers use to their record's target digest.
func containersUsing(name, target, configDigest string, containers []containerImage, targetOf map[string]string) []string {
	var out []string
	for _, c := range containers {
		switch {
		case c.Image == "":
		case c.Image == name, c.Image == target, configDigest != "" && c.Image == configDigest:
			out = append(out, c.ID)
		case targetOf[c.Image] == target:
			out = append(out, c.ID)
		}
	}
	slices.Sort(out)
	return out
}

// NormalizeRef turns a user's image reference into the name containerd and
// kubelet use for its record: "nginx" becomes
// "docker.io/library/nginx:latest", a reference with a digest keeps only
// the digest.
func NormalizeRef(ref string) (string, error) {
	if ref == "" {
		return "", fmt.Errorf("image reference: empty")
	}
	if len(ref) > 4096 {
		return "", fmt.Errorf("image reference: longer than 4096 bytes")
	}
	n, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", ref, err)
	}
	return n.String(), nil
}

// isDigestRef reports whether a normalized name pins a digest; such a name
// can never move, so it needs no registry round trip once present.
func isDigestRef(name string) bool {
	n, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return false
	}
	_, ok := n.(reference.Digested)
	return ok
}

// digestName is the digest reference of name's repository at digest, the
// name under which an old target is kept when a tag moves.
func digestName(name, digest string) (string, error) {
	n, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return "", err
	}
	return n.Name() + "@" + digest, nil
}
