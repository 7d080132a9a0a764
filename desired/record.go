package desired

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/warmfleet/warmfleet/spec"
)

// Record is one entry of the desired state: the latest write to a spec key.
// A nil Spec is a tombstone (the key was deleted at TS).
type Record struct {
	Key  string     `json:"k"`
	TS   Timestamp  `json:"t"`
	Spec *spec.Spec `json:"s,omitempty"`
}

// Deleted reports whether the record is a tombstone.
func (r Record) Deleted() bool { return r.Spec == nil }

const (
	maxKeyLen      = 1024
	maxNodeNameLen = 128
)

// validate checks a record that came from outside (peer or disk).
func (r Record) validate() error {
	if r.Key == "" || len(r.Key) > maxKeyLen {
		return fmt.Errorf("record key length %d: want 1..%d", len(r.Key), maxKeyLen)
	}
	if r.TS.Wall <= 0 || r.TS.Wall > maxWall {
		return fmt.Errorf("record %q: timestamp wall %d: want 1..%d", r.Key, r.TS.Wall, int64(maxWall))
	}
	if err := ValidateNodeName(r.TS.Node); err != nil {
		return fmt.Errorf("record %q: timestamp: %w", r.Key, err)
	}
	if r.Spec != nil {
		if err := r.Spec.Validate(); err != nil {
			return fmt.Errorf("record %q: %w", r.Key, err)
		}
		if k := r.Spec.Key(); k != r.Key {
			return fmt.Errorf("record key %q does not match its spec's key %q", r.Key, k)
		}
	}
	return nil
}

// ValidateNodeName checks a node name from outside (a peer's message, a
// timestamp read from disk, the daemon's flag): 1 to 128 bytes, none of
// them a space or control character. Gossip checks names with it too.
func ValidateNodeName(name string) error {
	if name == "" || len(name) > maxNodeNameLen {
		return fmt.Errorf("node name length %d: want 1..%d", len(name), maxNodeNameLen)
	}
	for _, c := range []byte(name) {
		if c <= ' ' || c == 0x7f {
			return errors.New("node name has a space or control character")
		}
	}
	return nil
}

// winner resolves two writes to the same key: the later timestamp wins. Equal
// timestamps only happen when the same write is seen twice, or when a node
// reuses a name and clock reading; a content order keeps the choice
// deterministic anyway (a tombstone beats a live spec, then the longer
// encoding, then bytes compare). The longer encoding wins because one write
// seen shorter is that write passed on by an older node, which drops the
// spec fields it does not know (pin, priority, applied_by): the copy that
// kept them is the write.
// winner is commutative, associative and idempotent, which is what lets
// records arrive in any order, any number of times.
func winner(a, b Record) Record {
	switch c := a.TS.Compare(b.TS); {
	case c > 0:
		return a
	case c < 0:
		return b
	}
	switch {
	case a.Deleted() && !b.Deleted():
		return a
	case b.Deleted() && !a.Deleted():
		return b
	case a.Deleted():
		return a
	}
	ja, _ := json.Marshal(a.Spec)
	jb, _ := json.Marshal(b.Spec)
	if len(ja) != len(jb) {
		if len(ja) > len(jb) {
			return a
		}
		return b
	}
	if bytes.Compare(ja, jb) >= 0 {
		return a
	}
	return b
}

// sameRecord reports whether two records are the same write.
func sameRecord(a, b Record) bool {
	if a.Key != b.Key || a.TS != b.TS || a.Deleted() != b.Deleted() {
		return false
	}
	return a.Deleted() || a.Spec.Equal(*b.Spec)
}

func cloneSpec(s spec.Spec) spec.Spec {
	s.Targets.Selector = maps.Clone(s.Targets.Selector)
	return s
}

func cloneRecord(r Record) Record {
	if r.Spec != nil {
		s := cloneSpec(*r.Spec)
		r.Spec = &s
	}
	return r
}
