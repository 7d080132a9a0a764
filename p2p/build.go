package p2p

import (
	"context"
	"errors"
	"fmt"
)

// BuildSpec describes a shard that has no manifest yet: its origin reads it,
// hashes each piece while writing it at its offset, and serves each piece,
// with its hash, as soon as it is in.
type BuildSpec struct {
	ShardID, Name            string
	Path                     string
	FileSize, Offset, Length int64
	// PieceLength defaults to DefaultPieceLength, Algo to BLAKE3.
	PieceLength int64
	Algo        HashAlgo
	Source      ByteSource
	Completion  Completion
	// Peers, if set, are asked for pieces too: members that followed an
	// origin which died mid-way hold pieces that need not be read again.
	Peers PeerSource
	// Concurrency is the number of origin reads in flight (default 4). They
	// are issued in file order so the shard fills front to back.
	Concurrency int
	// PieceCRC is FetchOptions.PieceCRC for the build.
	PieceCRC func(crc uint64, p []byte) uint64
	// ReadsStarted is FetchOptions.ReadsStarted for the build.
	ReadsStarted func()
}

// Skeleton returns the manifest the spec describes, without hashes: what
// OpenPartial takes, and what every node computes alike for a shard.
func (spec BuildSpec) Skeleton() *Manifest {
	m := &Manifest{ShardID: spec.ShardID, Name: spec.Name, FileSize: spec.FileSize,
		Offset: spec.Offset, Length: spec.Length, PieceLength: spec.PieceLength, Algo: spec.Algo}
	if m.PieceLength == 0 {
		m.PieceLength = DefaultPieceLength
	}
	if m.Algo == 0 {
		m.Algo = BLAKE3
	}
	if m.Algo.Size() > 0 && m.PieceLength > 0 {
		m.Hashes = make([]byte, m.NumPieces()*m.Algo.Size())
	}
	return m
}

// Build opens the shard with OpenPartial and fills it as its origin: every
// piece no connected peer holds is read from spec.Source, hashed and
// written, and served from then on. It returns the open, complete shard; its
// Manifest is the one the fleet uses. An interrupted Build resumes from the
// pieces it made durable.
func (n *Node) Build(ctx context.Context, spec BuildSpec) (*Shard, error) {
	if spec.Source == nil || spec.Completion == nil {
		return nil, errors.New("p2p: build needs a source and a completion store")
	}
	s, err := n.OpenPartial(ctx, spec.Skeleton(), spec.Path, spec.Completion)
	if err != nil {
		return nil, fmt.Errorf("p2p: build: %w", err)
	}
	if _, err := s.Fetch(ctx, FetchOptions{Peers: spec.Peers, Origin: spec.Source, OriginConcurrency: spec.Concurrency, PieceCRC: spec.PieceCRC, ReadsStarted: spec.ReadsStarted}); err != nil {
		s.Close()
		return nil, fmt.Errorf("p2p: build %s: %w", spec.ShardID, err)
	}
	return s, nil
}
