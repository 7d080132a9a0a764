package p2p

import (
	"bytes"
	"context"
	"fmt"
	"hash"
	"io"
	"time"
)

func (f *fetch) originWorker(ctx context.Context) {
	var buf []byte
	// OriginHelp looks at the fleet: ask it at most every helpRecheck, not
	// at every piece that changes the fetch's state.
	var stripe, stripes int
	var help bool
	var helpAsked time.Time
	for {
		if now := f.n.cfg.Now(); f.o.OriginAfter > 0 && f.o.OriginHelp != nil && now.Sub(helpAsked) >= helpRecheck {
			stripe, stripes, help = f.o.OriginHelp()
			helpAsked = now
		}
		f.mu.Lock()
		ch := f.changed()
		var wait time.Duration
		i := -1
		if f.o.OriginAfter > 0 {
			wait = f.o.OriginAfter - f.n.cfg.Now().Sub(f.lastPeerData)
		}
		switch {
		case wait <= 0:
			i = pickForOrigin(&f.st)
		case help && len(f.byKey) > 0:
			// Only once some peer said what it holds: before that, every
			// piece looks missing everywhere.
			i = pickForHelper(&f.st, stripe, stripes)
		}
		if i >= 0 {
			f.st.inflight[i] = true
		} else if f.o.OriginHelp != nil && wait > 0 {
			wait = min(wait, helpRecheck) // help may be allowed by then
		}
		started := f.o.ReadsStarted != nil && f.st.allStarted()
		f.mu.Unlock()
		if started {
			f.o.ReadsStarted() // once: Fetch made it a sync.OnceFunc
		}
		if i < 0 {
			if !waitChange(ctx, ch, wait) {
				return
			}
			continue
		}
		if buf == nil {
			buf = make([]byte, chunkSize)
		}
		crc, err := f.fromOriginPiece(ctx, i, buf)
		if err == nil {
			f.verified(i, false, crc)
			continue
		}
		f.release(i)
		if ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		f.originFails++
		fails := f.originFails
		f.mu.Unlock()
		f.n.log.Warn("p2p: origin read failed", "shard", f.s.m.ShardID, "piece", i, "err", err)
		if fails >= maxOriginFailures {
			f.cancel(fmt.Errorf("p2p: origin failed %d times: %w", fails, err))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(fails) * 50 * time.Millisecond):
		}
	}
}

func (f *fetch) fromOriginPiece(ctx context.Context, i int, buf []byte) (crc *uint64, err error) {
	off, n := f.s.m.PieceRange(i)
	h := f.newHasher()
	start := f.n.cfg.Now()
	if err := f.readOrigin(ctx, off, n, buf, h); err != nil {
		return nil, err
	}
	// Who read which piece, and how long it took, shows an origin falling
	// behind the others or helpers that never read (by_origin=false: a
	// helper, or a node whose peers all failed).
	f.n.log.Debug("p2p: piece read from the origin", "shard", f.s.m.ShardID, "piece", i, "of", f.s.m.NumPieces(),
		"took", f.n.cfg.Now().Sub(start), "by_origin", f.o.OriginAfter == 0)
	sum := h.Sum(nil)
	if want := f.s.pieceHash(i); want == nil {
		// Nobody hashed this piece yet: the origin is where hashes come
		// from, and the whole file is checked against S3's checksum later.
		return h.crc(), f.s.learn(i, sum)
	} else if !bytes.Equal(sum, want) {
		f.failed.Add(1)
		f.n.c.failed.Add(1)
		return nil, fmt.Errorf("piece %d: %w", i, ErrOriginCorrupt)
	}
	return h.crc(), nil
}

// readOrigin copies n origin bytes at off into the shard file through buf,
// and into h.
func (f *fetch) readOrigin(ctx context.Context, off, n int64, buf []byte, h hash.Hash) error {
	rc, err := f.o.Origin(ctx, off, n)
	if err != nil {
		return fmt.Errorf("origin read at %d: %w", off, err)
	}
	defer rc.Close()
	for done := int64(0); done < n; {
		k := min(int64(len(buf)), n-done)
		if _, err := io.ReadFull(rc, buf[:k]); err != nil {
			return fmt.Errorf("origin read at %d: %w", off+done, err)
		}
		f.originBytes.Add(k)
		f.n.c.originBytes.Add(k)
		h.Write(buf[:k])
		if err := f.s.writeAt(buf[:k], off+done); err != nil {
			f.cancel(err)
			return err
		}
		done += k
	}
	return nil
}
