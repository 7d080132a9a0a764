package desired

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"
)

// Store persists the desired state so it survives restarts.
type Store interface {
	// Load returns everything saved. Records are returned as stored; the
	// caller validates them.
	Load(ctx context.Context) (StoredState, error)
	// Save applies one change atomically.
	Save(ctx context.Context, c StoreChange) error
}

// StoredState is what a Store holds.
type StoredState struct {
	Records []Record
	// LastSync is when this node last merged a full state from a synced
	// peer; zero if never.
	LastSync time.Time
}

// StoreChange is one atomic update.
type StoreChange struct {
	Put    []Record
	Delete []string
	// LastSync, when not zero, replaces the stored sync time.
	LastSync time.Time
}

// BoltStore keeps the desired state in a bucket of a bbolt database that the
// caller owns (the daemon opens one database for everything).
type BoltStore struct {
	db     *bbolt.DB
	bucket []byte
}

var (
	boltRecords  = []byte("records")
	boltLastSync = []byte("last-sync")
)

// NewBoltStore returns a store in the named top-level bucket, creating it.
func NewBoltStore(db *bbolt.DB, bucket string) (*BoltStore, error) {
	if db == nil || bucket == "" {
		return nil, errors.New("desired store: need a database and a bucket name")
	}
	s := &BoltStore{db: db, bucket: []byte(bucket)}
	err := db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(s.bucket)
		if err != nil {
			return err
		}
		_, err = b.CreateBucketIfNotExists(boltRecords)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("desired store: create bucket %q: %w", bucket, err)
	}
	return s, nil
}

// Load implements Store.
func (s *BoltStore) Load(ctx context.Context) (StoredState, error) {
	if err := ctx.Err(); err != nil {
		return StoredState{}, err
	}
	var st StoredState
	err := s.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(s.bucket)
		if b == nil {
			return fmt.Errorf("bucket %q is missing", s.bucket)
		}
		if v := b.Get(boltLastSync); len(v) == 8 {
			st.LastSync = time.UnixMilli(int64(binary.BigEndian.Uint64(v)))
		}
		rb := b.Bucket(boltRecords)
		if rb == nil {
			return fmt.Errorf("bucket %q has no records bucket", s.bucket)
		}
		return rb.ForEach(func(k, v []byte) error {
			var r Record
			if err := json.Unmarshal(v, &r); err != nil {
				// Keep the key so the caller can report which record is bad.
				r = Record{Key: string(k)}
			}
			st.Records = append(st.Records, r)
			return nil
		})
	})
	if err != nil {
		return StoredState{}, fmt.Errorf("desired store: load: %w", err)
	}
	return st, nil
}

// Save implements Store.
func (s *BoltStore) Save(ctx context.Context, c StoreChange) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(s.bucket)
		if b == nil {
			return fmt.Errorf("bucket %q is missing", s.bucket)
		}
		rb := b.Bucket(boltRecords)
		if rb == nil {
			return fmt.Errorf("bucket %q has no records bucket", s.bucket)
		}
		for _, r := range c.Put {
			v, err := json.Marshal(r)
			if err != nil {
				return fmt.Errorf("encode %q: %w", r.Key, err)
			}
			if err := rb.Put([]byte(r.Key), v); err != nil {
				return fmt.Errorf("put %q: %w", r.Key, err)
			}
		}
		for _, k := range c.Delete {
			if err := rb.Delete([]byte(k)); err != nil {
				return fmt.Errorf("delete %q: %w", k, err)
			}
		}
		if !c.LastSync.IsZero() {
			var v [8]byte
			binary.BigEndian.PutUint64(v[:], uint64(c.LastSync.UnixMilli()))
			if err := b.Put(boltLastSync, v[:]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("desired store: save: %w", err)
	}
	return nil
}
