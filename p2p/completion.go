package p2p

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Completion persists which pieces of a shard are durably on disk, keyed by
// manifest ID. The swarm stores the whole bitfield after each fdatasync.
type Completion interface {
	// Load returns the stored bitfield, or nil when none is stored.
	Load(manifestID string) ([]byte, error)
	Store(manifestID string, bitfield []byte) error
	Delete(manifestID string) error
}

// BoltCompletion keeps completion bitfields in one bbolt bucket.
type BoltCompletion struct {
	db     *bolt.DB
	bucket []byte
}

// NewBoltCompletion stores completion in bucket of db, creating it if needed.
func NewBoltCompletion(db *bolt.DB, bucket string) (*BoltCompletion, error) {
	if bucket == "" {
		return nil, errors.New("completion: empty bucket name")
	}
	err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte(bucket))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("completion: create bucket %q: %w", bucket, err)
	}
	return &BoltCompletion{db: db, bucket: []byte(bucket)}, nil
}

// Load implements Completion.
func (c *BoltCompletion) Load(id string) ([]byte, error) {
	var out []byte
	err := c.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(c.bucket).Get([]byte(id)); v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("completion: load %s: %w", id, err)
	}
	return out, nil
}

// Store implements Completion.
func (c *BoltCompletion) Store(id string, bitfield []byte) error {
	err := c.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(c.bucket).Put([]byte(id), bitfield)
	})
	if err != nil {
		return fmt.Errorf("completion: store %s: %w", id, err)
	}
	return nil
}

// Delete implements Completion.
func (c *BoltCompletion) Delete(id string) error {
	err := c.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(c.bucket).Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("completion: delete %s: %w", id, err)
	}
	return nil
}
