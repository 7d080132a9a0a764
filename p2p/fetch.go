package p2p

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// PeerSource lists the p2p addresses (host:port) of members that may hold
// the shard. It is polled while a fetch runs, so it may change over time.
type PeerSource interface {
	Peers() []string
}

// PeerFunc adapts a function to PeerSource.
type PeerFunc func() []string

// Peers implements PeerSource.
func (f PeerFunc) Peers() []string { return f() }

// NamedPeerSource is a PeerSource that also says which node is at each
// address. A dial then names the node it means to reach in the handshake,
// and refuses anyone else answering there; in plaintext, that is what stops
// a member from passing another member's handshake through as its own.
type NamedPeerSource interface {
	PeerSource
	// NamedPeers maps node IDs to their p2p addresses.
	NamedPeers() map[string]string
}

// NamedPeerFunc adapts a function listing addresses by node ID to
// NamedPeerSource.
type NamedPeerFunc func() map[string]string

// Peers implements PeerSource.
func (f NamedPeerFunc) Peers() []string { return slices.Collect(maps.Values(f())) }

// NamedPeers implements NamedPeerSource.
func (f NamedPeerFunc) NamedPeers() map[string]string { return f() }

// ByteSource reads n bytes at file offset off from the origin (for example
// a ranged S3 GET of the object the shard belongs to).
type ByteSource func(ctx context.Context, off, n int64) (io.ReadCloser, error)

// FetchOptions says where a fetch may get pieces from.
type FetchOptions struct {
	// Peers to fetch from; nil means none.
	Peers PeerSource
	// Origin reads pieces no peer can supply; nil means peers only.
	Origin ByteSource
	// OriginAfter delays origin reads: 0 reads any piece that no connected
	// peer has right away (this node is the shard's origin); a positive value
	// reads them only once no peer has delivered a piece for that long (a
	// lone node, or one whose peers all failed).
	OriginAfter time.Duration
	// OriginConcurrency is the number of origin reads in flight (default 4).
	OriginConcurrency int
	// OriginHelp, if set, is asked while OriginAfter holds origin reads
	// back: ok means this node is free to help the shard's origin, reading
	// from the end of the shard the pieces of its stripe (of stripes) that
	// no peer has yet. An origin slowed by its crowded link then does not
	// hold up the whole fleet's last pieces.
	OriginHelp func() (stripe, stripes int, ok bool)
	// PieceCRC, if set, continues a CRC over a piece's bytes (from 0 for
	// each piece). Each piece's CRC is taken from the bytes that were
	// hashed and verified, and Shard.PieceCRCs returns them, so the whole
	// file can be checked against its object's CRC without reading it back.
	PieceCRC func(crc uint64, p []byte) uint64
	// PeerRefresh is how often Peers is polled (default 1s).
	PeerRefresh time.Duration
	// RequestDepth is the number of requests queued per peer (default 2, so
	// the next piece is already asked for while one streams).
	RequestDepth int
	// SyncInterval is how often verified pieces are made durable (default 2s).
	SyncInterval time.Duration
	// ReadsStarted, if set, is called once every missing piece is being
	// read or verified, so no further origin read will start: an origin can
	// begin its next shard while this one's last reads stream in.
	ReadsStarted func()
}

// FetchResult counts what one fetch moved.
type FetchResult struct {
	OriginBytes      int64
	PeerBytes        int64
	PiecesFromOrigin int64
	PiecesFromPeers  int64
	PiecesFailed     int64
}

// ErrOriginCorrupt means the origin returned bytes that do not match the
// manifest (for example the object changed since the manifest was made).
var ErrOriginCorrupt = errors.New("p2p: origin data does not match manifest")

var errFetchDone = errors.New("p2p: fetch complete")

// errStore marks a failure to put received bytes into the shard file: it
// stops the whole fetch, not just the connection.
var errStore = errors.New("p2p: storing piece")

const (
	busyBackoff        = 200 * time.Millisecond
	redialBackoff      = 2 * time.Second
	maxOriginFailures  = 3
	buffersPerPeerConn = 8
	helpRecheck        = 250 * time.Millisecond
)

type fetch struct {
	s      *Shard
	n      *Node
	o      FetchOptions
	cancel context.CancelCauseFunc

	originBytes, peerBytes, fromOrigin, fromPeers, failed atomic.Int64

	mu           sync.Mutex
	st           pickState
	conns        map[string]*peerConn // by address
	byKey        map[string]*peerConn // by identity key
	retryAt      map[string]time.Time
	lastPeerData time.Time
	changedCh    chan struct{}
	rnd          *rand.Rand
	originFails  int
}

// Fetch fills the shard's missing pieces from peers and the origin, serving
// what it has meanwhile, and returns once every piece is verified and
// durable, or with the error that stopped it (ctx's, a disk error, or
// ErrOriginCorrupt). Only one Fetch may run on a shard at a time. A twin
// (see Node.Open) first copies what the shard serving its ID on this node
// has and gets, and fetches the rest itself only if that one closes or
// stalls.
func (s *Shard) Fetch(ctx context.Context, o FetchOptions) (FetchResult, error) {
	s.mu.Lock()
	if s.fetching || s.closed {
		s.mu.Unlock()
		return FetchResult{}, errors.New("p2p: shard closed or already fetching")
	}
	s.fetching = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.fetching, s.running = false, nil
		s.wakeTwinsLocked()
		s.mu.Unlock()
	}()
	if o.ReadsStarted != nil {
		o.ReadsStarted = sync.OnceFunc(o.ReadsStarted)
		if s.n.twinSource(s) != nil {
			o.ReadsStarted() // a twin reads no origin while it copies
		}
	}
	if err := s.copyFromTwin(ctx, o); err != nil {
		return FetchResult{}, fmt.Errorf("p2p: fetch %s: %w", s.m.ShardID, errors.Join(err, s.Sync()))
	}
	if s.Complete() {
		return FetchResult{}, s.Sync()
	}
	s.mu.Lock()
	have := s.have.Clone()
	s.mu.Unlock()
	if o.OriginConcurrency <= 0 {
		o.OriginConcurrency = 4
	}
	if o.PeerRefresh <= 0 {
		o.PeerRefresh = time.Second
	}
	if o.RequestDepth <= 0 {
		o.RequestDepth = 2
	}
	if o.SyncInterval <= 0 {
		o.SyncInterval = 2 * time.Second
	}
	np := s.m.NumPieces()
	f := &fetch{
		s: s, n: s.n, o: o,
		st:           pickState{have: have, inflight: make([]bool, np), avail: make([]int32, np)},
		conns:        map[string]*peerConn{},
		byKey:        map[string]*peerConn{},
		retryAt:      map[string]time.Time{},
		lastPeerData: s.n.cfg.Now(),
		changedCh:    make(chan struct{}),
		rnd:          rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
	s.mu.Lock()
	s.running = f
	s.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	f.cancel = cancel
	defer cancel(nil)
	var wg sync.WaitGroup
	if o.Peers != nil {
		wg.Go(func() { f.peerLoop(ctx, &wg) })
	}
	if o.Origin != nil {
		for range o.OriginConcurrency {
			wg.Go(func() { f.originWorker(ctx) })
		}
	}
	wg.Go(func() { f.syncLoop(ctx) })
	select {
	case <-s.fullCh:
		cancel(errFetchDone)
	case <-ctx.Done():
	}
	wg.Wait()
	res := f.result()
	if !s.Complete() {
		err := fmt.Errorf("p2p: fetch %s: %w", s.m.ShardID, context.Cause(ctx))
		// Keep what was verified so the next Fetch resumes from it.
		if serr := s.Sync(); serr != nil {
			err = errors.Join(err, serr)
		}
		return res, err
	}
	full := s.n.cfg.Now()
	if err := s.Sync(); err != nil {
		return res, err
	}
	s.n.log.Debug("p2p: shard complete", "shard", s.m.ShardID, "from_origin", res.PiecesFromOrigin, "from_peers", res.PiecesFromPeers, "sync", s.n.cfg.Now().Sub(full))
	return res, nil
}

func (f *fetch) result() FetchResult {
	return FetchResult{
		OriginBytes: f.originBytes.Load(), PeerBytes: f.peerBytes.Load(),
		PiecesFromOrigin: f.fromOrigin.Load(), PiecesFromPeers: f.fromPeers.Load(),
		PiecesFailed: f.failed.Load(),
	}
}

// changed returns a channel closed at the next state change worth
// re-examining (a piece verified or released, a peer's set grew, a request
// slot freed). Call with f.mu held.
func (f *fetch) changed() chan struct{} { return f.changedCh }

// bump wakes everyone waiting on changed. Call with f.mu held.
func (f *fetch) bump() {
	close(f.changedCh)
	f.changedCh = make(chan struct{})
}

func (f *fetch) release(i int) {
	f.mu.Lock()
	f.st.inflight[i] = false
	f.bump()
	f.mu.Unlock()
}

func (f *fetch) verified(i int, fromPeer bool, crc *uint64) {
	f.s.markVerified(i, crc)
	f.mu.Lock()
	f.st.have.Set(i)
	f.st.inflight[i] = false
	f.originFails = 0
	f.bump()
	f.mu.Unlock()
	if fromPeer {
		f.fromPeers.Add(1)
	} else {
		f.fromOrigin.Add(1)
	}
}

func (f *fetch) syncLoop(ctx context.Context) {
	t := time.NewTicker(f.o.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := f.s.Sync(); err != nil {
				f.cancel(err)
				return
			}
		}
	}
}

// pieceHasher hashes a piece with its manifest's algorithm and, when the
// fetch asks for one, takes its FetchOptions.PieceCRC from the same bytes.
type pieceHasher struct {
	hash.Hash
	update func(uint64, []byte) uint64
	sum    uint64
}

func (f *fetch) newHasher() *pieceHasher {
	return &pieceHasher{Hash: f.s.m.Algo.new(), update: f.o.PieceCRC}
}

func (h *pieceHasher) Write(p []byte) (int, error) {
	if h.update != nil {
		h.sum = h.update(h.sum, p)
	}
	return h.Hash.Write(p)
}

func (h *pieceHasher) Reset() {
	h.Hash.Reset()
	h.sum = 0
}

// crc is the piece's CRC, or nil when none was asked for.
func (h *pieceHasher) crc() *uint64 {
	if h.update == nil {
		return nil
	}
	c := h.sum
	return &c
}

// withFile runs fn on the shard's open file, holding it open meanwhile.
func (s *Shard) withFile(fn func(*os.File) error) error {
	s.fileMu.RLock()
	defer s.fileMu.RUnlock()
	if s.file == nil {
		return fmt.Errorf("%w: shard closed", errStore)
	}
	return fn(s.file)
}

// hashFile hashes n bytes of file at off: mapped in place where the platform
// and file system allow, else read through a pooled buffer.
func hashFile(ctx context.Context, h hash.Hash, file *os.File, off, n int64, pool *bufPool) error {
	err := hashMapped(h, file, off, n)
	if !errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	h.Reset()
	buf, err := pool.get(ctx)
	if err != nil {
		return err
	}
	defer pool.put(buf)
	return hashRead(h, file, off, n, buf)
}

// hashRead hashes n bytes of file at off, read through buf.
func hashRead(h hash.Hash, file *os.File, off, n int64, buf []byte) error {
	got, err := io.CopyBuffer(h, io.NewSectionReader(file, off, n), buf)
	if err == nil && got != n {
		err = io.ErrUnexpectedEOF // the file is shorter than its manifest says
	}
	if err != nil {
		return fmt.Errorf("p2p: read back %s at %d: %w", file.Name(), off, err)
	}
	return nil
}
