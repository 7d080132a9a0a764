package torrentorigin

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/origintest"
	"github.com/warmfleet/warmfleet/internal/testutil/torrentseed"
	"github.com/warmfleet/warmfleet/origin"
)

const benchSize = 128 << 20

// BenchmarkLoopbackFetch: one file from a seeder on loopback through the
// origin's Download (parts in parallel, then the piece check read-back)
// (medians go in the report, with the load the machine had).
func BenchmarkLoopbackFetch(b *testing.B) {
	seeder := torrentseed.Start(b)
	_, magnet := seeder.Add(b, "bench.bin", []torrentseed.File{{Data: origintest.Bytes(40, benchSize)}}, 1<<20)
	b.SetBytes(benchSize)
	for b.Loop() {
		o, err := New(Options{Dir: b.TempDir(), Listen: "127.0.0.1:0"})
		if err != nil {
			b.Fatal(err)
		}
		objs, err := o.List(b.Context(), magnet)
		if err != nil {
			b.Fatal(err)
		}
		f := benchFile(b)
		if err := o.Download(b.Context(), objs[0], f, origin.Plan{}); err != nil {
			b.Fatal(err)
		}
		o.Close()
	}
}

// BenchmarkLoopbackFetchPlainAnacrolix is the baseline: a plain anacrolix
// client reading the same torrent from the same seeder.
func BenchmarkLoopbackFetchPlainAnacrolix(b *testing.B) {
	seeder := torrentseed.Start(b)
	mi, _ := seeder.Add(b, "bench.bin", []torrentseed.File{{Data: origintest.Bytes(40, benchSize)}}, 1<<20)
	b.SetBytes(benchSize)
	for b.Loop() {
		if got := torrentseed.Fetch(b, mi, seeder.Addr()); len(got) != benchSize {
			b.Fatalf("fetched %d bytes", len(got))
		}
	}
}

func benchFile(b *testing.B) *os.File {
	f, err := os.Create(filepath.Join(b.TempDir(), "copy"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return f
}
