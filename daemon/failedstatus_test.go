package daemon

import (
	"context"
	"errors"
	"testing"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/origin"
)

// failAfter wraps a real origin so that downloading one file fails, once
// every other file of the model has downloaded: a failure part way through.
type failAfter struct {
	Origin
	failPath string
	others   chan struct{} // closed when the other file is complete
}

func (o *failAfter) Download(ctx context.Context, obj origin.Object, dst origin.File, plan origin.Plan) error {
	if obj.Path != o.failPath {
		err := o.Origin.Download(ctx, obj, dst, plan)
		if err == nil {
			close(o.others)
		}
		return err
	}
	select {
	case <-o.others:
		return errors.New("connection reset by the test")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestFailedCacheShowsBytesOnDisk: a cache whose attempt failed part way
// reports the bytes that attempt left on disk (kept for the retry), not 0,
// and says whether the error needs action (this one does not).
func TestFailedCacheShowsBytesOnDisk(t *testing.T) {
	fx := newFixture(t, map[string]int{"a.safetensors": 3 << 20, "b.safetensors": 1 << 20})
	org := &failAfter{Origin: fx.origin(t, nil), failPath: "b.safetensors", others: make(chan struct{})}
	d := newDaemon(t, t.TempDir(), org)
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "failed", func() bool { return status(t, d, "meta/llama").State == api.StateFailed })
	st := status(t, d, "meta/llama")
	if st.BytesDone != 3<<20 || st.BytesTotal != 4<<20 {
		t.Fatalf("failed cache reports %d of %d bytes, want the %d of a.safetensors on disk", st.BytesDone, st.BytesTotal, 3<<20)
	}
	if st.NeedsAction || st.NextTry.IsZero() || st.Error == "" {
		t.Fatalf("failed cache %+v: want an error, a next try and no need for action", st)
	}
}

// TestEmptyPrefixNeedsAction: a source with no objects fails in a way that
// retrying alone will not fix, and the status says so.
func TestEmptyPrefixNeedsAction(t *testing.T) {
	fx := newFixture(t, map[string]int{"model.safetensors": 1 << 10})
	d := newDaemon(t, t.TempDir(), fx.origin(t, nil))
	run(t, d)
	sp := fx.spec()
	sp.Source = "s3://" + fx.bucket + "/nothing-here/"
	if err := d.AddCache(t.Context(), sp); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "failed", func() bool { return status(t, d, "meta/llama").State == api.StateFailed })
	if st := status(t, d, "meta/llama"); !st.NeedsAction || st.NextTry.IsZero() {
		t.Fatalf("empty prefix: %+v, want needs_action and a next try", st)
	}
}
