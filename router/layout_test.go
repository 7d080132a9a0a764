package router

import (
	"testing"
	"unsafe"
)

// TestBackendLayout: the fields a decision reads for every backend lie in
// the backend's first four cache lines, and a backend is small enough that
// backends do not sit a power-of-two KiB apart. A 1 KiB object (as the
// self-tuning state made it) puts the same line of every backend in four
// L1 sets, which hold 32 lines: a 64-backend decision then evicted its
// own backends' lines within one pass and missed on each again.
func TestBackendLayout(t *testing.T) {
	var b backend
	end := func(off, size uintptr) uintptr { return off + size }
	fields := map[string]uintptr{
		"id":              end(unsafe.Offsetof(b.id), unsafe.Sizeof(b.id)),
		"limit":           end(unsafe.Offsetof(b.limit), unsafe.Sizeof(b.limit)),
		"slots":           end(unsafe.Offsetof(b.slots), unsafe.Sizeof(b.slots)),
		"inflight":        end(unsafe.Offsetof(b.inflight), unsafe.Sizeof(b.inflight)),
		"pending":         end(unsafe.Offsetof(b.pending), unsafe.Sizeof(b.pending)),
		"prefilling":      end(unsafe.Offsetof(b.prefilling), unsafe.Sizeof(b.prefilling)),
		"recent":          end(unsafe.Offsetof(b.recent), unsafe.Sizeof(b.recent)),
		"peers":           end(unsafe.Offsetof(b.peers), unsafe.Sizeof(b.peers)),
		"ejectedUntil":    end(unsafe.Offsetof(b.ejectedUntil), unsafe.Sizeof(b.ejectedUntil)),
		"ep.Models":       end(unsafe.Offsetof(b.ep)+unsafe.Offsetof(b.ep.Models), unsafe.Sizeof(b.ep.Models)),
		"ep.Ready":        end(unsafe.Offsetof(b.ep)+unsafe.Offsetof(b.ep.Ready), 1),
		"ep.HoldsWeights": end(unsafe.Offsetof(b.ep)+unsafe.Offsetof(b.ep.HoldsWeights), 1),
		"ep.ReadySince":   end(unsafe.Offsetof(b.ep)+unsafe.Offsetof(b.ep.ReadySince), unsafe.Sizeof(b.ep.ReadySince)),
		"kvTrusted":       end(unsafe.Offsetof(b.kvTrusted), 1),
	}
	for name, e := range fields {
		if e > 256 {
			t.Errorf("backend.%s ends at byte %d, past the first four cache lines", name, e)
		}
	}
	if size := unsafe.Sizeof(b); size >= 512 {
		t.Errorf("a backend is %d bytes: backends would be 512 bytes or more apart, in a few L1 sets", size)
	}
}
