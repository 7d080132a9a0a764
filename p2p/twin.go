package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"
)

// A node may open one shard ID at several paths: models cached under
// different names from identical files get the same revision and so the
// same shard IDs. The first one opened is served and fetched as usual; the
// others, its twins, copy each piece from its file as it is verified, so
// the content crosses the network and is read from the origin once.

// twinIdle is how long a twin waits on a source that is neither complete
// nor being fetched (its fetch failed and it was left open) before it
// fetches on its own.
const twinIdle = 2 * time.Second

// twinPoll bounds a twin's wait between looks at its source.
const twinPoll = 500 * time.Millisecond

// errTwinMismatch means a source file's bytes no longer match their hash
// (changed on disk): the twin stops copying and fetches the rest itself.
var errTwinMismatch = errors.New("p2p: twin's bytes do not match their hash")

// copyFromTwin fills s from the shard serving its ID on this node when that
// is another file of the same pieces, piece by piece as the source verifies
// them; each piece is hashed again on the way. It returns nil once s is
// complete or there is no source to follow any more (it closed, s took over
// serving, it stays idle, its bytes do not match): the fetch then goes on
// from peers and the origin. Only an error writing s stops the fetch.
func (s *Shard) copyFromTwin(ctx context.Context, o FetchOptions) error {
	var buf []byte
	var idleSince time.Time
	for !s.Complete() {
		src := s.n.twinSource(s)
		if src == nil {
			return nil
		}
		src.mu.Lock()
		moved, ready, busy := src.moved, src.have.Clone(), src.fetching && !src.closed
		src.mu.Unlock()
		mine := s.Have()
		for i := range s.m.NumPieces() {
			if !ready.Has(i) || mine.Has(i) {
				continue
			}
			if buf == nil {
				buf = make([]byte, chunkSize)
			}
			if err := s.copyPiece(src, i, buf, o.PieceCRC); err != nil {
				if errors.Is(err, errStore) {
					return err
				}
				s.n.log.Warn("p2p: cannot copy from twin, fetching instead", "shard", s.m.ShardID, "twin", src.path, "err", err)
				return nil
			}
		}
		if s.Complete() {
			return nil
		}
		now := s.n.cfg.Now()
		switch {
		case busy || src.Complete():
			idleSince = time.Time{}
		case idleSince.IsZero():
			idleSince = now
		case now.Sub(idleSince) >= twinIdle:
			s.n.log.Info("p2p: twin's source is idle, fetching instead", "shard", s.m.ShardID, "twin", src.path)
			return nil
		}
		t := time.NewTimer(twinPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-moved:
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// copyPiece copies verified piece i of src into s, checking its hash.
func (s *Shard) copyPiece(src *Shard, i int, buf []byte, crc func(uint64, []byte) uint64) error {
	want := src.pieceHash(i)
	f, release := src.readFile(i)
	if f == nil || want == nil {
		return errors.New("p2p: twin closed")
	}
	defer release()
	off, n := s.m.PieceRange(i)
	h := &pieceHasher{Hash: s.m.Algo.new(), update: crc}
	for done := int64(0); done < n; {
		k := min(int64(len(buf)), n-done)
		if _, err := f.ReadAt(buf[:k], off+done); err != nil {
			return fmt.Errorf("p2p: read twin %s: %w", src.path, err)
		}
		h.Write(buf[:k]) //nolint:errcheck // a hash.Hash never returns an error
		if err := s.writeAt(buf[:k], off+done); err != nil {
			return fmt.Errorf("%w: %w", errStore, err)
		}
		done += k
	}
	if !bytes.Equal(h.Sum(nil), want) {
		return fmt.Errorf("piece %d of %s: %w", i, src.path, errTwinMismatch)
	}
	if err := s.learn(i, want); err != nil {
		return err
	}
	s.markVerified(i, h.crc())
	return nil
}
