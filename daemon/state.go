package daemon

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/spec"
)

// State schema (bbolt, file <data-dir>/state.db). Every bucket, and the
// version that brought it:
//
//	meta      "schema" -> uint64 big-endian schema version (created by migrate itself)
//
//	v1  caches    model name -> JSON cacheRecord        (what this node has or is fetching;
//	              fields are added with omitempty, so older records read as before)
//	    parts     name \x00 revision \x00 file path -> bitmap of the file's completed
//	              download parts (bit i = part i of partSize bytes), so a restart
//	              resumes without fetching finished ranges again
//	    endpoints URL -> JSON api.Endpoint              (inference endpoints on this node)
//	v2  manifests swarm shard ID (revision/path#index) -> encoded p2p.Manifest
//	v3  retired   name \x00 revision -> JSON retiredRecord (revisions no longer current,
//	              kept on disk until their grace runs out)
//	v4  pieces    manifest ID (hex SHA-256) -> piece bitfield, owned by
//	              p2p.BoltCompletion (which pieces of a shard are durably on disk)
//	v5  shards    swarm shard ID -> encoded p2p.Manifest with zero hashes: the piece
//	              layout of a shard this node opened before its manifest was complete
//	              (as its origin or following one); dropped once the manifest is in
//	              manifests. A restart resumes such a shard through the swarm, cut the
//	              same way, with the pieces (and hashes) its completion record holds.
//
// One bucket has no migration, as its owner creates it and its layout:
//
//	desired   the fleet's desired state, owned by desired.BoltStore:
//	          nested bucket "records" (record key -> JSON desired.Record, LWW)
//	          and key "last-sync" -> uint64 big-endian Unix milliseconds
//
// Migrations run in order at open; each upgrades the schema by one version in
// a single transaction, so a crash mid-migration leaves the old version.
var (
	bucketMeta      = []byte("meta")
	bucketDesired   = "desired"
	bucketCaches    = []byte("caches")
	bucketEndpoints = []byte("endpoints")
	bucketManifests = []byte("manifests")
	bucketShards    = []byte("shards")
	bucketParts     = []byte("parts")
	bucketRetired   = []byte("retired")
	bucketPieces    = "pieces"
	keySchema       = []byte("schema")
)

// migrations[i] upgrades schema version i to i+1.
var migrations = []func(tx *bolt.Tx) error{
	func(tx *bolt.Tx) error { // 0 -> 1: initial buckets
		for _, b := range [][]byte{bucketCaches, bucketParts, bucketEndpoints} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	},
	func(tx *bolt.Tx) error { // 1 -> 2: swarm manifests
		_, err := tx.CreateBucketIfNotExists(bucketManifests)
		return err
	},
	func(tx *bolt.Tx) error { // 2 -> 3: retired revisions
		_, err := tx.CreateBucketIfNotExists(bucketRetired)
		return err
	},
	func(tx *bolt.Tx) error { // 3 -> 4: swarm piece completion, created by p2p.NewBoltCompletion before
		_, err := tx.CreateBucketIfNotExists([]byte(bucketPieces))
		return err
	},
	func(tx *bolt.Tx) error { // 4 -> 5: layouts of swarm shards begun without their manifest
		_, err := tx.CreateBucketIfNotExists(bucketShards)
		return err
	},
}

// cacheRecord is what the node knows of one model cache.
type cacheRecord struct {
	Spec       spec.Spec `json:"spec"`
	RevisionID string    `json:"revision_id,omitempty"`
	// Updating is the revision being fetched while RevisionID stays ready.
	Updating   string       `json:"updating,omitempty"`
	State      string       `json:"state"`
	Files      []fileRecord `json:"files,omitempty"`
	PartSize   int64        `json:"part_size,omitempty"`
	BytesDone  int64        `json:"bytes_done"`
	BytesTotal int64        `json:"bytes_total"`
	Error      string       `json:"error,omitempty"`
	Attempts   int          `json:"attempts,omitempty"`
	NextTry    time.Time    `json:"next_try,omitzero"`
	CheckedAt  time.Time    `json:"checked_at,omitzero"`
	UpdatedAt  time.Time    `json:"updated_at"`
	ReadyAt    time.Time    `json:"ready_at,omitzero"`
	Path       string       `json:"path,omitempty"`

	// NeedsAction: the last error is one retrying alone will not fix (see
	// needsAction).
	NeedsAction bool `json:"needs_action,omitempty"`
	// Listing digests a listing whose file set differs from Files and
	// waits for the next listing to agree before it is acted upon.
	Listing string `json:"listing,omitempty"`
	// FilesChanged is the last change of the source's file set.
	FilesChanged *api.FileSetChange `json:"files_changed,omitempty"`
	// Space is the shortage of the last attempt that did not fit.
	Space *api.SpaceShortage `json:"space,omitempty"`
}

// fetching is the revision whose parts are being downloaded.
func (r cacheRecord) fetching() string {
	if r.Updating != "" {
		return r.Updating
	}
	return r.RevisionID
}

type fileRecord struct {
	Key       string `json:"key"`
	Path      string `json:"path"`
	Size      int64  `json:"size"`
	ETag      string `json:"etag,omitempty"`
	VersionID string `json:"version_id,omitempty"`
}

// state is the daemon's durable state.
type state struct {
	db *bolt.DB
}

func openState(path string) (*state, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("state %s is locked: is another daemon running on this data dir?", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, err
	}
	return &state{db: db}, nil
}

func (s *state) close() error { return s.db.Close() }

// SchemaVersion is the version migrate brings a state file to.
func SchemaVersion() uint64 { return uint64(len(migrations)) }

func migrate(db *bolt.DB) error {
	for {
		var done bool
		err := db.Update(func(tx *bolt.Tx) error {
			meta, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return err
			}
			var v uint64
			if b := meta.Get(keySchema); len(b) == 8 {
				v = binary.BigEndian.Uint64(b)
			}
			if v > SchemaVersion() {
				return fmt.Errorf("state schema %d is newer than this binary's %d: refusing to downgrade", v, SchemaVersion())
			}
			if v == SchemaVersion() {
				done = true
				return nil
			}
			if err := migrations[v](tx); err != nil {
				return fmt.Errorf("migrate state %d -> %d: %w", v, v+1, err)
			}
			return meta.Put(keySchema, binary.BigEndian.AppendUint64(nil, v+1))
		})
		if err != nil || done {
			return err
		}
	}
}

func (s *state) putJSON(bucket []byte, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(key), b) })
}

func (s *state) record(name string) (cacheRecord, bool, error) {
	var rec cacheRecord
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketCaches).Get([]byte(name))
		if b == nil {
			return nil
		}
		found = true
		return json.Unmarshal(b, &rec)
	})
	return rec, found, err
}

func (s *state) records() (map[string]cacheRecord, error) {
	out := map[string]cacheRecord{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCaches).ForEach(func(k, v []byte) error {
			var rec cacheRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("cache record %q: %w", k, err)
			}
			out[string(k)] = rec
			return nil
		})
	})
	return out, err
}

func (s *state) putRecord(rec cacheRecord) error {
	return s.putJSON(bucketCaches, rec.Spec.Name, rec)
}

// deleteRecord drops a cache's record, every part bitmap of it and its
// retired revisions (the model's removal deleted them all).
func (s *state) deleteRecord(name string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketCaches).Delete([]byte(name)); err != nil {
			return err
		}
		if err := deletePrefix(tx.Bucket(bucketRetired), []byte(name+"\x00"), nil); err != nil {
			return err
		}
		return deletePrefix(tx.Bucket(bucketParts), []byte(name+"\x00"), nil)
	})
}

// retiredRecord is what the state keeps of a retired revision.
type retiredRecord struct {
	RetiredAt time.Time `json:"retired_at"`
	// Bytes is the space the revision took on disk when it was retired.
	Bytes int64 `json:"bytes"`
}

func retiredKey(name, revision string) []byte { return []byte(name + "\x00" + revision) }

// retire records revisions of name (revision -> bytes on disk) as retired
// at when. A revision retired earlier keeps its time: its grace runs from
// when it first stopped being current.
func (s *state) retire(name string, revisions map[string]int64, at time.Time) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRetired)
		for rev, n := range revisions {
			if b.Get(retiredKey(name, rev)) != nil {
				continue
			}
			v, err := json.Marshal(retiredRecord{RetiredAt: at, Bytes: n})
			if err != nil {
				return err
			}
			if err := b.Put(retiredKey(name, rev), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// unretire forgets a revision's retirement: it is current again, or gone.
func (s *state) unretire(name, revision string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketRetired).Delete(retiredKey(name, revision)) })
}

// retired lists every retired revision of every model.
func (s *state) retired() ([]retiredRevision, error) {
	var out []retiredRevision
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRetired).ForEach(func(k, v []byte) error {
			name, rev, ok := strings.Cut(string(k), "\x00")
			if !ok {
				return fmt.Errorf("retired revision key %q: no separator", k)
			}
			var r retiredRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("retired revision %q: %w", k, err)
			}
			out = append(out, retiredRevision{Model: name, Revision: rev, RetiredAt: r.RetiredAt, Bytes: r.Bytes})
			return nil
		})
	})
	return out, err
}

// deleteParts drops the part bitmaps of every revision of name but keep.
func (s *state) deleteParts(name, keep string) error {
	keepPrefix := []byte(name + "\x00" + keep + "\x00")
	return s.db.Update(func(tx *bolt.Tx) error {
		return deletePrefix(tx.Bucket(bucketParts), []byte(name+"\x00"), func(k []byte) bool {
			return keep != "" && hasPrefix(k, keepPrefix)
		})
	})
}

func partsKey(name, revision, path string) []byte {
	return []byte(name + "\x00" + revision + "\x00" + path)
}

func (s *state) parts(name, revision, path string) (bitmap, error) {
	var bm bitmap
	err := s.db.View(func(tx *bolt.Tx) error {
		bm = bitmap(append([]byte(nil), tx.Bucket(bucketParts).Get(partsKey(name, revision, path))...))
		return nil
	})
	return bm, err
}

func (s *state) putParts(name, revision, path string, bm bitmap) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketParts).Put(partsKey(name, revision, path), bm)
	})
}

func (s *state) endpoints() ([]api.Endpoint, error) {
	var out []api.Endpoint
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketEndpoints).ForEach(func(k, v []byte) error {
			var ep api.Endpoint
			if err := json.Unmarshal(v, &ep); err != nil {
				return fmt.Errorf("endpoint %q: %w", k, err)
			}
			out = append(out, ep)
			return nil
		})
	})
	return out, err
}

func (s *state) putEndpoint(ep api.Endpoint) error { return s.putJSON(bucketEndpoints, ep.URL, ep) }

func (s *state) deleteEndpoint(url string) (bool, error) {
	var found bool
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEndpoints)
		found = b.Get([]byte(url)) != nil
		return b.Delete([]byte(url))
	})
	return found, err
}

// deletePrefix deletes the keys that start with prefix, except those keep
// (if not nil) reports true for.
func deletePrefix(b *bolt.Bucket, prefix []byte, keep func([]byte) bool) error {
	c := b.Cursor()
	var doomed [][]byte
	for k, _ := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, _ = c.Next() {
		if keep == nil || !keep(k) {
			doomed = append(doomed, append([]byte(nil), k...))
		}
	}
	for _, k := range doomed {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

func hasPrefix(b, prefix []byte) bool {
	return len(b) >= len(prefix) && string(b[:len(prefix)]) == string(prefix)
}

// bitmap is a set of part indexes.
type bitmap []byte

func (b bitmap) has(i int) bool { return i/8 < len(b) && b[i/8]&(1<<(i%8)) != 0 }

func (b bitmap) with(i int) bitmap {
	for len(b) <= i/8 {
		b = append(b, 0)
	}
	b[i/8] |= 1 << (i % 8)
	return b
}

func (b bitmap) count() int {
	n := 0
	for _, x := range b {
		for ; x != 0; x &= x - 1 {
			n++
		}
	}
	return n
}
