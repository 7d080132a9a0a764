// Package nodelabels labels the daemon's own Kubernetes Node with what is
// warm on it, so pods can be scheduled where their model and image already
// are:
//
//	nodeSelector:
//	  cache.warmfleet.io/llama-3-8b: ready
//	  image.warmfleet.io/ghcr.io-acme-vllm-v1..<hash>: ready
//
// # What the Node carries
//
// For every model cache ready on the node at the revision the fleet wants,
// a label cache.warmfleet.io/<name>=ready and an annotation under the same
// key holding the revision id; for every ready image, the same under
// image.warmfleet.io/ with the image digest. A cache that goes, or whose new
// revision is not yet complete here, loses both: the label promises the
// wanted bytes, not some older ones. The caller decides what is ready and
// passes it as a State; Desired turns a State into labels and annotations.
//
// # From names to keys
//
// A label key's name part is at most 63 letters, digits, '-', '_' and '.',
// starting and ending with a letter or digit. KeyName maps any string to
// such a name, readable where it can be, never the same name for two
// strings (up to an 80-bit SHA-256 collision):
//
//   - a name that already fits, with no "--" or "..", is kept as it is;
//   - "org/model" whose parts each fit that way becomes "org--model"
//     (model names never contain "--");
//   - anything else becomes a readable part (other characters turned to
//     '-', at most 45 of them), "..", and 16 base32 characters of the
//     SHA-256 of the whole string.
//
// Each form holds a mark the others cannot, so they never meet. The mapping
// is part of the interface: users write these keys into their pod specs, so
// it must never change from one release to the next (the tests pin it).
//
// # Ownership
//
// Every key under cache.warmfleet.io/ and image.warmfleet.io/ belongs to
// warmfleet; no other key is ever written or removed. Patch builds a JSON
// merge patch naming only owned keys (null deletes one), so a patch that
// races with another controller's change to the Node cannot undo it, and no
// resourceVersion is needed.
//
// # The Labeler
//
// A Labeler holds the latest State (Update never blocks; a newer State
// replaces one not yet applied) and Run applies it: a Get of the Node, then
// a Patch when something differs. It re-checks every Resync so a label
// removed by hand comes back. A failure (RBAC refusal, missing Node, API
// server away) is logged, counted in warmfleet_node_label_syncs_total by
// result, and retried after a backoff that doubles from MinBackoff to
// MaxBackoff with up to half of it taken off at random; States that
// arrive meanwhile wait for it. Optional Events on the Node announce items
// that became ready or failed; they are best effort and never retried.
//
// # Permissions
//
// The daemon's service account needs get and patch on nodes (a
// ClusterRole: Nodes have no namespace) and, for Events, create on events in
// the default namespace (a Role). deploy/kubernetes/rbac.yaml holds both; the
// Helm chart renders the same with daemon.nodeLabels (events optional).
// RBAC cannot limit a service account to its own Node or to some label
// keys; an admission policy can, where that matters.
package nodelabels
