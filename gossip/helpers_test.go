package gossip

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/desired"
	"github.com/warmfleet/warmfleet/spec"
	"go.etcd.io/bbolt"
)

// testClock is a settable wall clock.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock {
	return &testClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// openDB opens a bbolt database in a temp dir (fsync off: tests only).
func openDB(t testing.TB) *bbolt.DB {
	t.Helper()
	return openDBAt(t, filepath.Join(t.TempDir(), "state.db"))
}

func openDBAt(t testing.TB, path string) *bbolt.DB {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{NoSync: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func newDesired(t testing.TB, db *bbolt.DB, name string, now func() time.Time) *desired.State {
	t.Helper()
	st, err := desired.NewBoltStore(db, "desired")
	if err != nil {
		t.Fatal(err)
	}
	d, err := desired.New(context.Background(), st, desired.Options{NodeName: name, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func modelSpec(name string) spec.Spec {
	return spec.Spec{Kind: spec.KindModel, Name: name, Source: "s3://models/" + name + "/"}
}

func keys(specs []spec.Spec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Key()
	}
	return out
}

func fmtRecords(rs []desired.Record) string {
	s := ""
	for _, r := range rs {
		state := "live"
		if r.Deleted() {
			state = "tomb"
		} else {
			state += ":" + r.Spec.Revision
		}
		s += fmt.Sprintf("%s@%d.%d.%s=%s ", r.Key, r.TS.Wall, r.TS.Logical, r.TS.Node, state)
	}
	return s
}
