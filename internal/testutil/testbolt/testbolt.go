// Package testbolt opens the bbolt databases tests keep state in: a real
// database file, closed when the test ends, with fsync off (a test never
// survives a power cut, and fsync would only slow it).
//
// It is test support: only _test.go files and test-support packages import
// it, never a product package.
package testbolt

import (
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

// Open opens (or creates) the database at path until the test ends. Open
// the same path again after closing it to play a restart.
func Open(tb testing.TB, path string) *bbolt.DB {
	tb.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{NoSync: true, Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// OpenTemp opens a new database in a directory of its own.
func OpenTemp(tb testing.TB) *bbolt.DB {
	tb.Helper()
	return Open(tb, filepath.Join(tb.TempDir(), "state.db"))
}
