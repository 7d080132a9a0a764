package daemon

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/origin"
)

// flakyList wraps a real origin so that listing fails while fail is set, as
// when S3 is unreachable, and blocks for one source until gate is closed.
type flakyList struct {
	Origin
	fail   atomic.Bool
	lists  atomic.Int64
	gateOn string
	gate   chan struct{}
}

func (o *flakyList) List(ctx context.Context, src string) ([]origin.Object, error) {
	o.lists.Add(1)
	if o.fail.Load() {
		return nil, errors.New("S3 endpoint unreachable")
	}
	if o.gate != nil && src == o.gateOn {
		select {
		case <-o.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return o.Origin.List(ctx, src)
}

// TestFailedResyncKeepsReady: a ready cache whose periodic re-check cannot
// reach S3 keeps its verified, published files ready and served; the error
// is reported and the check retried.
func TestFailedResyncKeepsReady(t *testing.T) {
	fx := newFixture(t, map[string]int{"model.safetensors": 1 << 20})
	org := &flakyList{Origin: fx.origin(t, nil)}
	d := newDaemonResync(t, t.TempDir(), org, 100*time.Millisecond)
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "meta/llama").Ready })
	ready := status(t, d, "meta/llama")

	org.fail.Store(true)
	wait.For(t, "failed re-check recorded", func() bool {
		st := status(t, d, "meta/llama")
		return st.Error != "" || st.State != api.StateReady
	})
	st := status(t, d, "meta/llama")
	if !st.Ready || st.State != api.StateReady || st.Path != ready.Path || st.RevisionID != ready.RevisionID {
		t.Fatalf("after a failed re-check: %+v, want still ready at %s", st, ready.Path)
	}
	inv, err := d.inventory()
	if err != nil {
		t.Fatal(err)
	}
	if m := inv.Models["meta/llama"]; m.State != gossip.StateReady || m.Path != ready.Path {
		t.Fatalf("fleet sees %+v after a failed re-check, want ready", m)
	}
	checkFiles(t, st.Path, fx.files)

	// Once S3 answers again the error clears.
	org.fail.Store(false)
	wait.For(t, "error cleared", func() bool { return status(t, d, "meta/llama").Error == "" })
	if st := status(t, d, "meta/llama"); !st.Ready || st.Attempts != 0 {
		t.Fatalf("after recovery: %+v", st)
	}
}

// TestChangedSourceNotReadyUntilFetched: after a spec asks for different
// files, the API does not call the cache ready (and `cache add --wait` does
// not return) until those files are cached.
func TestChangedSourceNotReadyUntilFetched(t *testing.T) {
	fx := newFixture(t, map[string]int{"model.safetensors": 1 << 20})
	other := []byte("other weights")
	fx.put(t, "other/model.safetensors", other)
	org := &flakyList{Origin: fx.origin(t, nil), gateOn: "s3://" + fx.bucket + "/other/", gate: make(chan struct{})}
	d := newDaemon(t, t.TempDir(), org)
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "meta/llama").Ready })
	old := status(t, d, "meta/llama")

	changed := fx.spec()
	changed.Source = "s3://" + fx.bucket + "/other/"
	if err := d.AddCache(t.Context(), changed); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, "meta/llama"); st.Ready || st.Source != changed.Source {
		t.Fatalf("right after the source changed: %+v, want %s not ready (old files at %s)", st, changed.Source, old.Path)
	}
	close(org.gate)
	wait.For(t, "new source ready", func() bool { return status(t, d, "meta/llama").Ready })
	st := status(t, d, "meta/llama")
	if st.RevisionID == old.RevisionID {
		t.Fatalf("ready with the old revision %s", st.RevisionID)
	}
	checkFiles(t, st.Path, map[string][]byte{"model.safetensors": other})
}
