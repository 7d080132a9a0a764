package memorigin_test

import (
	"sync/atomic"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/origintest"
	"github.com/warmfleet/warmfleet/origin/memorigin"
)

// The in-memory origin passes the suite the S3 client passes.
func TestConformance(t *testing.T) {
	origintest.Run(t, func(t *testing.T) origintest.Fixture {
		var n atomic.Int64
		o := memorigin.New(memorigin.Options{PartSize: 64 << 10, OnBytes: func(k int) { n.Add(int64(k)) }})
		o.CreateBucket("models")
		return origintest.Fixture{
			Origin: o, Bucket: "models", Missing: "nope", PartSize: 64 << 10,
			Put:    func(_ *testing.T, key string, data []byte) { o.Put("models", key, data) },
			Delete: func(_ *testing.T, key string) { o.Delete("models", key) },
			Bytes:  n.Load,
		}
	})
}
