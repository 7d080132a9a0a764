package desired

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/spec"
	"go.etcd.io/bbolt"
)

func newDesired(t testing.TB, db *bbolt.DB, name string, now func() time.Time) *State {
	t.Helper()
	st, err := NewBoltStore(db, "desired")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(context.Background(), st, Options{NodeName: name, Now: now})
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

func fmtRecords(rs []Record) string {
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
