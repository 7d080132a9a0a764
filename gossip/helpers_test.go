package gossip

import (
	"context"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/desired"
	"github.com/warmfleet/warmfleet/spec"
	"go.etcd.io/bbolt"
)

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
