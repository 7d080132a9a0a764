package p2p

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// BuildSpec describes a shard that has no manifest yet: its origin reads it,
// hashes each piece while writing it at its offset, and publishes the
// resulting manifest.
type BuildSpec struct {
	ShardID, Name            string
	Path                     string
	FileSize, Offset, Length int64
	// PieceLength defaults to DefaultPieceLength, Algo to BLAKE3.
	PieceLength int64
	Algo        HashAlgo
	Source      ByteSource
	Completion  Completion
	// Concurrency is the number of origin reads in flight (default 4). They
	// are issued in file order so the shard fills front to back.
	Concurrency int
}

// Build reads the shard from spec.Source, writes and hashes every piece,
// makes it durable, and opens it for serving. The manifest is
// Shard.Manifest(). An interrupted Build starts over: there are no hashes to
// resume against.
func (n *Node) Build(ctx context.Context, spec BuildSpec) (*Shard, error) {
	if spec.Source == nil || spec.Completion == nil {
		return nil, errors.New("p2p: build needs a source and a completion store")
	}
	if spec.PieceLength == 0 {
		spec.PieceLength = DefaultPieceLength
	}
	if spec.Algo == 0 {
		spec.Algo = BLAKE3
	}
	if spec.Concurrency <= 0 {
		spec.Concurrency = 4
	}
	m := &Manifest{ShardID: spec.ShardID, Name: spec.Name, FileSize: spec.FileSize,
		Offset: spec.Offset, Length: spec.Length, PieceLength: spec.PieceLength, Algo: spec.Algo}
	m.Hashes = make([]byte, m.NumPieces()*m.Algo.Size())
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("p2p: build: %w", err)
	}
	file, ino, _, err := openShardFile(spec.Path, m)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range spec.Concurrency {
		wg.Go(func() {
			buf := make([]byte, chunkSize)
			for {
				i := int(next.Add(1) - 1)
				if i >= m.NumPieces() || ctx.Err() != nil {
					return
				}
				var err error
				for attempt := 0; attempt < maxOriginFailures; attempt++ {
					if err = n.buildPiece(ctx, m, spec.Source, file.WriteAt, i, buf); err == nil || ctx.Err() != nil {
						break
					}
					n.log.Warn("p2p: build: origin read failed", "shard", m.ShardID, "piece", i, "err", err)
				}
				if err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("p2p: build %s: %w", m.ShardID, err)
	}
	if err := fdatasync(file); err != nil {
		return nil, fmt.Errorf("p2p: build %s: sync: %w", m.ShardID, err)
	}
	full := NewBitfield(m.NumPieces())
	for i := range m.NumPieces() {
		full.Set(i)
	}
	if err := spec.Completion.Store(m.ID(), completionRecord(ino, full)); err != nil {
		return nil, err
	}
	return n.Open(ctx, m, spec.Path, spec.Completion)
}

func (n *Node) buildPiece(ctx context.Context, m *Manifest, src ByteSource, writeAt func([]byte, int64) (int, error), i int, buf []byte) error {
	off, size := m.PieceRange(i)
	rc, err := src(ctx, off, size)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := m.Algo.new()
	for done := int64(0); done < size; {
		k := min(int64(len(buf)), size-done)
		if _, err := io.ReadFull(rc, buf[:k]); err != nil {
			return fmt.Errorf("read at %d: %w", off+done, err)
		}
		n.c.originBytes.Add(k)
		h.Write(buf[:k])
		if _, err := writeAt(buf[:k], off+done); err != nil {
			return fmt.Errorf("write at %d: %w", off+done, err)
		}
		done += k
	}
	// Each worker writes a distinct slot, so no lock is needed.
	copy(m.Hashes[i*m.Algo.Size():], h.Sum(nil))
	return nil
}
