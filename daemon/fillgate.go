package daemon

import (
	"context"
	"io"
	"sync"
)

// fillGate lets a file's end-to-end check read the file while the swarm
// still fills it: a read waits until every shard it touches is complete.
// Origins whose digest cannot be combined from piece CRCs (a Hub file's
// sha256, a git blob id) read the whole copy back to check it; done after
// the fill, on a node whose link is already idle, that read-back and its
// hashing add to the warm-up, while during the fill they run on bytes still
// in the page cache and on CPU the network leaves idle, so only the shards
// that land last remain to check once the fill ends.
type fillGate struct {
	mu    sync.Mutex
	spans []fillSpan
	wake  chan struct{} // closed and replaced when a shard completes
}

// fillSpan is one shard's byte range of the file and whether it is filled.
type fillSpan struct {
	off, n int64
	done   bool
}

func newFillGate(spans []fillSpan) *fillGate {
	return &fillGate{spans: spans, wake: make(chan struct{})}
}

// done marks shard i (an index into the spans given) filled.
func (g *fillGate) done(i int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.spans[i].done = true
	close(g.wake)
	g.wake = make(chan struct{})
}

// ready reports whether bytes [off, off+n) are filled, and else a channel
// closed when another shard completes.
func (g *fillGate) ready(off, n int64) (bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.spans {
		if !s.done && off < s.off+s.n && s.off < off+n {
			return false, g.wake
		}
	}
	return true, nil
}

// reader returns r gated: its ReadAt waits for the bytes it reads to be
// filled, or fails with ctx's cause once ctx ends (the fill failed).
func (g *fillGate) reader(ctx context.Context, r io.ReaderAt) io.ReaderAt {
	return gatedReader{g: g, ctx: ctx, r: r}
}

type gatedReader struct {
	g   *fillGate
	ctx context.Context
	r   io.ReaderAt
}

func (gr gatedReader) ReadAt(p []byte, off int64) (int, error) {
	for {
		ok, wake := gr.g.ready(off, int64(len(p)))
		if ok {
			return gr.r.ReadAt(p, off)
		}
		select {
		case <-wake:
		case <-gr.ctx.Done():
			return 0, context.Cause(gr.ctx)
		}
	}
}
