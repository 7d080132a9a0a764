// Package api is the daemon's local HTTP/JSON API: the wire types, the
// address syntax (unix:///path/to.sock or host:port) and a client for the CLI
// and for tests.
package api

import (
	"time"

	"github.com/warmfleet/warmfleet/spec"
)

// Cache states, in the order a healthy cache passes through them.
const (
	StatePending     = "pending"
	StateDownloading = "downloading"
	StateVerifying   = "verifying"
	StateReady       = "ready"
	StateFailed      = "failed"
	// StateNotTargeted: the cache is desired in the fleet, but its targets
	// leave this node out, so this node will not cache it.
	StateNotTargeted = "not-targeted"
	// StateInsufficientSpace: the cache does not fit on this node even
	// after evicting what it may (CacheStatus.Space has the numbers); it
	// is tried again with backoff.
	StateInsufficientSpace = "insufficient-space"
	// StateEvicted: the cache's files were evicted to make room for a
	// cache of its priority or higher; it comes back when it fits without
	// evicting others.
	StateEvicted = "evicted"
)

// SpaceShortage is why a cache does not fit: the bytes it needs, what is
// free (less the reserve) and what the caches it may evict hold together.
type SpaceShortage struct {
	Needed    int64 `json:"needed_bytes"`
	Free      int64 `json:"free_bytes"`
	Evictable int64 `json:"evictable_bytes"`
}

// CacheStatus is one model cache on one node.
type CacheStatus struct {
	Name     string `json:"name"`
	Source   string `json:"source"`
	Revision string `json:"revision,omitempty"`
	// RevisionID names the cached content: the user's revision label (if
	// any) and a digest of every object's key, size, ETag and version.
	RevisionID string `json:"revision_id,omitempty"`
	// Commit is the commit an hf:// source's revision resolved to, or a torrent source's info hash: every
	// file of RevisionID was read at it (a moved branch is a new revision).
	Commit string `json:"commit,omitempty"`
	State  string `json:"state"`
	// Ready is true only when every file of the revision is complete,
	// verified and published; Path is then its local directory.
	Ready      bool   `json:"ready"`
	Path       string `json:"path,omitempty"`
	Files      int    `json:"files"`
	BytesDone  int64  `json:"bytes_done"`
	BytesTotal int64  `json:"bytes_total"`
	Error      string `json:"error,omitempty"`
	Attempts   int    `json:"attempts,omitempty"`
	// NextTry is when a failed attempt (Error) is tried again.
	NextTry   time.Time `json:"next_try,omitzero"`
	UpdatedAt time.Time `json:"updated_at"`
	ReadyAt   time.Time `json:"ready_at,omitzero"`
	// Targets is what the spec asks of the fleet.
	Targets spec.Targets `json:"targets,omitzero"`
	// Pin, Priority and AppliedBy are the spec's (see spec.Spec).
	Pin       bool   `json:"pin,omitempty"`
	Priority  int    `json:"priority,omitempty"`
	AppliedBy string `json:"applied_by,omitempty"`
	// FilesChanged reports the last change of the source's file set.
	FilesChanged *FileSetChange `json:"files_changed,omitempty"`
	// Space says why an insufficient-space or evicted cache does not fit.
	Space *SpaceShortage `json:"space,omitempty"`
	// Nodes holds the fleet-wide view, one entry per node, when the daemon
	// is in a gossip cluster.
	Nodes []NodeCacheStatus `json:"nodes,omitempty"`
	// TargetNodes are the nodes the cache's targets select in this
	// daemon's view of the fleet (this node alone, if selected, without
	// gossip), sorted; ReadyNodes is how many of them report it ready.
	// Empty for a cache no longer desired. The view is gossip's: another
	// node's progress arrives a moment after it happens.
	TargetNodes []string `json:"target_nodes,omitempty"`
	ReadyNodes  int      `json:"ready_nodes"`

	// NeedsAction is set on a failed cache whose last error retrying alone
	// will not fix (no objects under the prefix, no such bucket, credentials
	// rejected or lacking permission, a key that cannot be a local path).
	// The daemon still retries at NextTry, so fixing the source is enough,
	// but a client waiting for the cache should stop and say so.
	NeedsAction bool `json:"needs_action,omitempty"`
}

// VerifyResult is what re-hashing a ready cache found
// (POST /v1/verify/{name}).
type VerifyResult struct {
	Name       string `json:"name"`
	RevisionID string `json:"revision_id"`
	Files      int    `json:"files"`
	// Checked counts the files whose every byte matched the source's digest.
	Checked int `json:"checked"`
	// Damaged files were dropped and are being fetched again (Repairing);
	// the cache is not ready meanwhile.
	Damaged    []DamagedFile `json:"damaged,omitempty"`
	LinkBroken bool          `json:"link_broken,omitempty"`
	Repairing  bool          `json:"repairing,omitempty"`
	// Unverifiable files have no digest on the server to check against.
	Unverifiable []DamagedFile `json:"unverifiable,omitempty"`
	// SourceChanged files changed in S3 since they were cached: the next
	// resync fetches the new revision.
	SourceChanged []string `json:"source_changed,omitempty"`
}

// FileSetChange is a change of the files under a model's source: objects
// that went (deleted) or came. A listing with another file set is acted
// upon only when the next listing (at the next attempt) agrees; until then
// Confirmed is false and the cache keeps its former files.
type FileSetChange struct {
	Gone      []string  `json:"gone,omitempty"`
	Came      []string  `json:"came,omitempty"`
	Confirmed bool      `json:"confirmed"`
	At        time.Time `json:"at"`
}

// DamagedFile is one file and what is wrong with it.
type DamagedFile struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// NodeCacheStatus is a cache's state on one fleet member.
type NodeCacheStatus struct {
	Node       string `json:"node"`
	State      string `json:"state"`
	Ready      bool   `json:"ready"`
	RevisionID string `json:"revision_id,omitempty"`
	BytesDone  int64  `json:"bytes_done"`
	BytesTotal int64  `json:"bytes_total"`
}

// AddCacheRequest asks for a model cache (POST /v1/caches).
type AddCacheRequest struct {
	Name     string       `json:"name"`
	Source   string       `json:"source"`
	Revision string       `json:"revision,omitempty"`
	Include  []string     `json:"include,omitempty"`
	Exclude  []string     `json:"exclude,omitempty"`
	Targets  spec.Targets `json:"targets,omitzero"`
	// Pin and Priority are the capacity settings (see spec.Spec).
	Pin      bool `json:"pin,omitempty"`
	Priority int  `json:"priority,omitempty"`
}

// Spec converts the request to a desired-state spec.
func (r AddCacheRequest) Spec() spec.Spec {
	return spec.Spec{Kind: spec.KindModel, Name: r.Name, Source: r.Source, Revision: r.Revision,
		Include: r.Include, Exclude: r.Exclude, Targets: r.Targets, Pin: r.Pin, Priority: r.Priority}
}

// NodeInfo describes the daemon (GET /v1/node).
type NodeInfo struct {
	Name       string            `json:"name"`
	Version    string            `json:"version"`
	DataDir    string            `json:"data_dir"`
	Labels     map[string]string `json:"labels,omitempty"`
	TotalBytes int64             `json:"total_bytes"`
	FreeBytes  int64             `json:"free_bytes"`
	// AvailableBytes is what the cache may still use (free less reserve).
	AvailableBytes int64 `json:"available_bytes"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
}

// Endpoint is an inference server running on a node, registered so routers
// can find it (POST /v1/endpoints).
type Endpoint struct {
	Model string `json:"model"`
	URL   string `json:"url"`
	// Speed is its engine's prefill and decode speed relative to the
	// fleet's usual backend (0: 1), which routers weigh its traffic share
	// and queue by (router.BackendConfig.Speed); 1/64..64.
	Speed float64 `json:"speed,omitempty"`
	// AppliedBy names the source that applied it (see spec.Spec); empty
	// for one registered by hand. POST /v1/endpoints refuses it set.
	AppliedBy string `json:"applied_by,omitempty"`
}

// Member is one fleet member as the daemon sees it (GET /v1/fleet).
type Member struct {
	Name       string                 `json:"name"`
	Addr       string                 `json:"addr"`
	State      string                 `json:"state"`
	Role       string                 `json:"role"`
	Self       bool                   `json:"self,omitempty"`
	Labels     map[string]string      `json:"labels,omitempty"`
	Zone       string                 `json:"zone,omitempty"`
	Version    string                 `json:"version,omitempty"`
	APIAddr    string                 `json:"api_addr,omitempty"`
	PeerAddr   string                 `json:"peer_addr,omitempty"`
	Models     map[string]MemberModel `json:"models,omitempty"`
	Images     map[string]MemberModel `json:"images,omitempty"`
	Endpoints  []Endpoint             `json:"endpoints,omitempty"`
	FreeBytes  int64                  `json:"free_bytes,omitempty"`
	TotalBytes int64                  `json:"total_bytes,omitempty"`
	// S3Bytes, PeerBytesIn and PeerBytesOut are the bytes the member's
	// process read from S3 and received from and sent to peers.
	S3Bytes      int64 `json:"s3_bytes,omitempty"`
	PeerBytesIn  int64 `json:"peer_bytes_in,omitempty"`
	PeerBytesOut int64 `json:"peer_bytes_out,omitempty"`
	// InventoryVersion and LastUpdate say how fresh this view is.
	InventoryVersion uint64    `json:"inventory_version,omitempty"`
	LastUpdate       time.Time `json:"last_update,omitzero"`
}

// MemberModel is a cached item on a member.
type MemberModel struct {
	Revision   string `json:"revision,omitempty"`
	State      string `json:"state"`
	BytesDone  int64  `json:"bytes_done,omitempty"`
	BytesTotal int64  `json:"bytes_total,omitempty"`
}

// Fleet is the daemon's view of the fleet.
type Fleet struct {
	// Clustered is false for a daemon running without gossip.
	Clustered bool     `json:"clustered"`
	Members   []Member `json:"members"`
}

// ImageStatus is one container image on a node (GET /v1/images).
type ImageStatus struct {
	Ref    string   `json:"ref"`
	Digest string   `json:"digest,omitempty"`
	Size   int64    `json:"size,omitempty"`
	Owners []string `json:"owners,omitempty"`
	// Managed is true when warmfleet pulled the image and may remove it.
	Managed  bool   `json:"managed"`
	Unpacked bool   `json:"unpacked"`
	State    string `json:"state"`
	// BytesDone and BytesTotal are layer bytes fetched during a pull.
	BytesDone  int64  `json:"bytes_done,omitempty"`
	BytesTotal int64  `json:"bytes_total,omitempty"`
	Error      string `json:"error,omitempty"`
	// Wanted lists the owners the fleet's desired state asks this node to
	// hold the image for.
	Wanted []string `json:"wanted,omitempty"`
}

// AddImageRequest asks for an image to be pre-pulled (POST /v1/images).
type AddImageRequest struct {
	Ref     string       `json:"ref"`
	Owner   string       `json:"owner"`
	Targets spec.Targets `json:"targets,omitzero"`
}

// Spec converts the request to a desired-state spec.
func (r AddImageRequest) Spec() spec.Spec {
	return spec.Spec{Kind: spec.KindImage, Name: r.Ref, Owner: r.Owner, Targets: r.Targets}
}

// ApplyRequest is one source's desired state (POST /v1/apply): what
// `warmfleet apply -f` read, as specs and endpoints. The daemon plans it
// against what it holds with the rules of package internal/manifest and,
// unless DryRun, carries it out: specs go to the fleet's desired state,
// endpoints to this node.
type ApplyRequest struct {
	// Owner names the source; what it creates records it as AppliedBy.
	Owner string `json:"owner"`
	// Prune deletes what Owner applied before that the request no longer
	// names.
	Prune  bool `json:"prune,omitempty"`
	DryRun bool `json:"dry_run,omitempty"`
	// Delete deletes the objects named instead of applying them (`delete
	// -f`): those Owner applied or made by hand; another owner's are
	// refused. Not with Prune.
	Delete bool `json:"delete,omitempty"`
	// Specs are model and image caches; their AppliedBy must be empty
	// or Owner.
	Specs     []spec.Spec `json:"specs,omitempty"`
	Endpoints []Endpoint  `json:"endpoints,omitempty"`
}

// ApplyChange is one step of an apply: create, update or delete of a key
// (a spec's key, or "endpoint/" and its URL).
type ApplyChange struct {
	Action string `json:"action"`
	Key    string `json:"key"`
}

// ApplyResult is what an apply did, or would do when DryRun.
type ApplyResult struct {
	Owner     string        `json:"owner"`
	DryRun    bool          `json:"dry_run,omitempty"`
	Changes   []ApplyChange `json:"changes,omitempty"`
	Unchanged int           `json:"unchanged"`
	// Missing counts, for a delete, named objects the daemon did not hold.
	Missing int `json:"missing,omitempty"`
	// Diff is the plan written for a person.
	Diff string `json:"diff"`
}

// ApplyDirStatus is the daemon's watched directory (GET /v1/apply-dir).
type ApplyDirStatus struct {
	// Dir is empty when the daemon watches none.
	Dir   string            `json:"dir,omitempty"`
	Files []ApplyFileStatus `json:"files,omitempty"`
}

// ApplyFileStatus is one file of the watched directory: each file is its
// own source (Owner), so a broken file changes nothing of what the others
// or its own last good version applied.
type ApplyFileStatus struct {
	File  string `json:"file"`
	Owner string `json:"owner"`
	// Digest is the SHA-256 of the content last read.
	Digest string `json:"digest"`
	// Error says why that content was not applied (bad YAML, a field the
	// schema lacks, another owner's object, the state failing); empty once
	// it was.
	Error     string    `json:"error,omitempty"`
	AppliedAt time.Time `json:"applied_at,omitzero"`
	// Objects counts the documents of the content last applied.
	Objects int `json:"objects"`
}
