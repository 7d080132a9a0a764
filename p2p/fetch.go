package p2p

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
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
	byID         map[string]*peerConn
	retryAt      map[string]time.Time
	lastPeerData time.Time
	changedCh    chan struct{}
	rnd          *rand.Rand
	originFails  int
	readsStarted sync.Once
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
		s.fetching = false
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
		byID:         map[string]*peerConn{},
		retryAt:      map[string]time.Time{},
		lastPeerData: s.n.cfg.Now(),
		changedCh:    make(chan struct{}),
		rnd:          rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
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

// ---- origin ----

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
		case help && len(f.byID) > 0:
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
			f.readsStarted.Do(f.o.ReadsStarted)
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

// ---- peers ----

func (f *fetch) peerLoop(ctx context.Context, wg *sync.WaitGroup) {
	t := time.NewTicker(f.o.PeerRefresh)
	defer t.Stop()
	for {
		now := f.n.cfg.Now()
		for _, addr := range f.o.Peers.Peers() {
			f.mu.Lock()
			_, busy := f.conns[addr]
			skip := busy || now.Before(f.retryAt[addr])
			if !skip {
				f.conns[addr] = nil // reserved while dialing
			}
			f.mu.Unlock()
			if skip || f.n.Banned(addr) {
				if !skip {
					f.dropAddr(addr, 0)
				}
				continue
			}
			wg.Go(func() { f.runPeer(ctx, addr) })
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// dropAddr forgets a connection slot and schedules the next dial.
func (f *fetch) dropAddr(addr string, backoff time.Duration) {
	f.mu.Lock()
	delete(f.conns, addr)
	f.retryAt[addr] = f.n.cfg.Now().Add(backoff)
	f.mu.Unlock()
}

type pieceJob struct {
	piece int
	off   int64
	buf   []byte
	first bool
	last  bool
	refs  *atomic.Int32 // hasher and writer each drop one; the last frees buf
}

type peerConn struct {
	f       *fetch
	addr    string
	id      string
	c       net.Conn
	br      *bufio.Reader
	has     Bitfield // under f.mu
	pending []int    // requested pieces in answer order, under f.mu
	busy    time.Time
	held    chan struct{} // receive buffers this connection holds
	hashCh  chan pieceJob
	writeCh chan pieceJob
	sums    chan pieceSum // hasher -> writer: did piece match, in piece order
	bad     atomic.Bool   // sent a bad piece: ignore the rest
	// rx, when set, splices piece bodies from the socket into the file;
	// spliced pieces then go to fileCh to be hashed from the file.
	rx     *splicer
	fileCh chan int
}

func (f *fetch) dial(ctx context.Context, addr string) (net.Conn, string, error) {
	deadline := f.n.cfg.Now().Add(f.n.cfg.DialTimeout)
	d := net.Dialer{Deadline: deadline}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, "", err
	}
	c, id, err := f.n.auth.client(raw, deadline)
	if err != nil {
		if errors.Is(err, ErrUnauthenticated) {
			f.n.c.authFail.Add(1)
			f.n.log.Warn("p2p: peer failed authentication", "addr", addr, "err", err)
		}
		raw.Close()
		return nil, "", err
	}
	return c, id, nil
}

func (f *fetch) runPeer(ctx context.Context, addr string) {
	backoff := redialBackoff
	defer func() { f.dropAddr(addr, backoff) }()
	c, id, err := f.dial(ctx, addr)
	if err != nil {
		f.n.log.Debug("p2p: dial failed", "addr", addr, "err", err)
		return
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if id == f.n.cfg.NodeID {
		backoff = time.Hour // our own address
		return
	}
	if f.n.Banned(id) {
		backoff = f.n.cfg.BanDuration
		return
	}
	if err := writeFrame(c, msgSubscribe, append(f.s.skel[:], f.s.m.ShardID...)); err != nil {
		return
	}
	br := bufio.NewReaderSize(c, 64<<10)
	_ = c.SetReadDeadline(f.n.cfg.Now().Add(f.n.cfg.DialTimeout))
	fr, err := readFrameMax(br, maxBitfieldFrame)
	if err != nil || fr.typ != msgBitfield {
		// Not open there (yet): gossip may list the peer a moment before it
		// opens the shard, so ask again at the next refresh.
		backoff = f.o.PeerRefresh
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	has, err := f.learnBitfield(fr.payload)
	if err != nil {
		f.n.log.Warn("p2p: bad bitfield, banning peer", "peer", id, "err", err)
		f.n.Ban(id)
		backoff = f.n.cfg.BanDuration
		return
	}
	pc := &peerConn{f: f, addr: addr, id: id, c: c, br: br, has: has,
		held:    make(chan struct{}, buffersPerPeerConn),
		hashCh:  make(chan pieceJob, buffersPerPeerConn),
		writeCh: make(chan pieceJob, buffersPerPeerConn),
		sums:    make(chan pieceSum, buffersPerPeerConn),
		fileCh:  make(chan int, buffersPerPeerConn)}
	// Plain TCP on Linux: splice saves the copy through user space. TLS
	// (and any other platform) reads into buffers as before.
	if rx, err := newSplicer(c); err == nil {
		pc.rx = rx
		defer rx.Close()
	} else if !errors.Is(err, errors.ErrUnsupported) {
		f.n.log.Debug("p2p: splice unavailable, reading into buffers", "peer", id, "err", err)
	}
	f.mu.Lock()
	if f.byID[id] != nil {
		f.mu.Unlock()
		return // already connected to this node under another address
	}
	f.conns[addr], f.byID[id] = pc, pc
	for i := range f.st.avail {
		if has.Has(i) {
			f.st.avail[i]++
		}
	}
	f.bump()
	f.mu.Unlock()
	f.n.c.connected.Add(1)
	defer f.n.c.connected.Add(-1)

	peerCtx, peerDone := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if pc.rx != nil {
		wg.Go(func() { pc.fileHashLoop(ctx) })
	} else {
		wg.Go(func() { pc.hashLoop() })
		wg.Go(func() { pc.writeLoop() })
	}
	wg.Go(func() { pc.requestLoop(peerCtx) })
	err = pc.readLoop(peerCtx)
	peerDone()
	c.Close()
	close(pc.hashCh)
	close(pc.writeCh)
	close(pc.fileCh)
	wg.Wait()

	f.mu.Lock()
	for _, i := range pc.pending {
		f.st.inflight[i] = false
	}
	for i := range f.st.avail {
		if pc.has.Has(i) {
			f.st.avail[i]--
		}
	}
	delete(f.byID, id)
	f.bump()
	f.mu.Unlock()
	if errors.Is(err, errProtocol) {
		f.n.log.Warn("p2p: dropping peer", "peer", id, "err", err)
	} else {
		f.n.log.Debug("p2p: peer connection ended", "peer", id, "err", err)
	}
	if f.n.Banned(id) {
		backoff = f.n.cfg.BanDuration
	}
}

// learnBitfield parses a peer's bitfield and the hashes that follow it,
// learning the ones this shard does not know yet.
func (f *fetch) learnBitfield(payload []byte) (Bitfield, error) {
	np := f.s.m.NumPieces()
	bfLen := (np + 7) / 8
	if len(payload) < bfLen {
		return Bitfield{}, fmt.Errorf("%w: short bitfield", errProtocol)
	}
	has, err := ParseBitfield(payload[:bfLen], np)
	if err != nil {
		return Bitfield{}, err
	}
	size := f.s.m.Algo.Size()
	hashes := payload[bfLen:]
	if len(hashes) != has.Count()*size {
		return Bitfield{}, fmt.Errorf("%w: %d bytes of hashes for %d pieces", errProtocol, len(hashes), has.Count())
	}
	for i := range np {
		if has.Has(i) {
			if err := f.s.learn(i, hashes[:size]); err != nil {
				return Bitfield{}, err
			}
			hashes = hashes[size:]
		}
	}
	return has, nil
}

// requestLoop keeps RequestDepth pieces asked for from this peer.
func (pc *peerConn) requestLoop(ctx context.Context) {
	f := pc.f
	for {
		f.mu.Lock()
		ch := f.changed()
		var reqs []int
		now := f.n.cfg.Now()
		wait := pc.busy.Sub(now)
		for wait <= 0 && len(pc.pending) < f.o.RequestDepth {
			i := pickRarest(&f.st, pc.has, f.rnd.IntN)
			if i < 0 {
				break
			}
			f.st.inflight[i] = true
			if len(pc.pending) == 0 {
				_ = pc.c.SetReadDeadline(now.Add(f.n.cfg.StallTimeout))
			}
			pc.pending = append(pc.pending, i)
			reqs = append(reqs, i)
		}
		f.mu.Unlock()
		for _, i := range reqs {
			if err := writeFrame(pc.c, msgRequest, u32(i)); err != nil {
				pc.c.Close()
				return
			}
		}
		if !waitChange(ctx, ch, wait) {
			return
		}
	}
}

// waitChange waits for ch, or for wait to pass when positive; false once ctx
// is done.
func waitChange(ctx context.Context, ch <-chan struct{}, wait time.Duration) bool {
	var timer <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-ch:
	case <-timer:
	}
	return true
}

// popPending removes the answered request at the front and keeps the stall
// deadline armed exactly while something is outstanding.
func (pc *peerConn) popPending(i int) error {
	f := pc.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(pc.pending) == 0 || pc.pending[0] != i {
		return fmt.Errorf("%w: answer for piece %d not asked for next", errProtocol, i)
	}
	pc.pending = pc.pending[1:]
	if len(pc.pending) == 0 {
		_ = pc.c.SetReadDeadline(time.Time{})
	} else {
		_ = pc.c.SetReadDeadline(f.n.cfg.Now().Add(f.n.cfg.StallTimeout))
	}
	f.bump()
	return nil
}

func (pc *peerConn) readLoop(ctx context.Context) error {
	f := pc.f
	np := f.s.m.NumPieces()
	for {
		fr, err := readFrame(pc.br)
		if err != nil {
			return err
		}
		switch fr.typ {
		case msgHave:
			i, err := fr.index(np)
			if err != nil {
				return err
			}
			if err := f.s.learn(i, fr.payload[4:]); err != nil {
				f.n.log.Warn("p2p: peer announced a conflicting piece hash, banning it", "peer", pc.id, "shard", f.s.m.ShardID, "piece", i)
				f.n.Ban(pc.id)
				return err
			}
			f.mu.Lock()
			if !pc.has.Has(i) {
				pc.has.Set(i)
				f.st.avail[i]++
				f.bump()
			}
			f.mu.Unlock()
		case msgBusy:
			i, err := fr.index(np)
			if err != nil {
				return err
			}
			if err := pc.popPending(i); err != nil {
				return err
			}
			f.mu.Lock()
			pc.busy = f.n.cfg.Now().Add(busyBackoff)
			f.st.inflight[i] = false
			f.bump()
			f.mu.Unlock()
		case msgPiece:
			if err := pc.readPiece(ctx, fr, np); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: unexpected frame type %d", errProtocol, fr.typ)
		}
	}
}

// readPiece receives one piece body; the piece stays at the front of
// pending until its last byte is in.
func (pc *peerConn) readPiece(ctx context.Context, fr frame, np int) error {
	f := pc.f
	i, err := fr.index(np)
	if err != nil {
		return err
	}
	off, size := f.s.m.PieceRange(i)
	if len(fr.payload) != 8 || int64(binary.BigEndian.Uint32(fr.payload[4:])) != size {
		return fmt.Errorf("%w: piece %d header", errProtocol, i)
	}
	f.mu.Lock()
	expected := len(pc.pending) > 0 && pc.pending[0] == i
	f.mu.Unlock()
	if !expected {
		return fmt.Errorf("%w: piece %d not asked for next", errProtocol, i)
	}
	if pc.rx != nil {
		err = pc.splicePiece(ctx, i, off, size)
	} else {
		err = pc.streamPiece(ctx, i, off, size)
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.lastPeerData = f.n.cfg.Now()
	f.mu.Unlock()
	return pc.popPending(i)
}

// streamPiece reads a piece body into pooled buffers a chunk at a time and
// hands each chunk to both hashLoop and writeLoop.
func (pc *peerConn) streamPiece(ctx context.Context, i int, off, size int64) error {
	f := pc.f
	for done := int64(0); done < size; {
		// A connection holds at most buffersPerPeerConn buffers, so one
		// slow writer cannot take the whole pool.
		select {
		case pc.held <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		buf, err := f.n.recv.get(ctx)
		if err != nil {
			<-pc.held
			return err
		}
		k := min(int64(len(buf)), size-done)
		if err := f.n.downLim.WaitN(ctx, int(k)); err != nil {
			return err
		}
		if _, err := io.ReadFull(pc.br, buf[:k]); err != nil {
			return err
		}
		_ = pc.c.SetReadDeadline(f.n.cfg.Now().Add(f.n.cfg.StallTimeout))
		f.peerBytes.Add(k)
		f.n.c.peerIn.Add(k)
		j := pieceJob{piece: i, off: off + done, buf: buf[:k], first: done == 0, last: done+k == size, refs: new(atomic.Int32)}
		j.refs.Store(2)
		pc.hashCh <- j
		pc.writeCh <- j
		done += k
	}
	return nil
}

// splicePiece puts a piece body into the file without passing it through
// user space: the bytes the bufio.Reader already holds are written from its
// buffer, the rest is spliced from the socket. fileHashLoop then checks the
// piece from the file while the next one streams in.
func (pc *peerConn) splicePiece(ctx context.Context, i int, off, size int64) error {
	f := pc.f
	step := int64(chunkSize) // the limiter's burst
	if f.n.downLim.Limit() == rate.Inf {
		step = int64(pc.rx.capacity())
	}
	for done := int64(0); done < size; {
		k := min(step, size-done)
		buffered := int64(pc.br.Buffered())
		if buffered > 0 {
			k = min(k, buffered)
		}
		if err := f.n.downLim.WaitN(ctx, int(k)); err != nil {
			return err
		}
		var err error
		if buffered > 0 {
			b, _ := pc.br.Peek(int(k)) // k <= buffered: cannot fail
			err = f.s.writeAt(b, off+done)
			_, _ = pc.br.Discard(int(k))
		} else {
			err = pc.rx.receive(f.s.withFile, off+done, int(k))
		}
		if err != nil {
			if buffered > 0 || errors.Is(err, errStore) {
				f.cancel(err)
			}
			return err
		}
		_ = pc.c.SetReadDeadline(f.n.cfg.Now().Add(f.n.cfg.StallTimeout))
		f.peerBytes.Add(k)
		f.n.c.peerIn.Add(k)
		done += k
	}
	pc.fileCh <- i
	return nil
}

func (pc *peerConn) done(j pieceJob) {
	if j.refs.Add(-1) == 0 {
		pc.f.n.recv.put(j.buf)
		<-pc.held
	}
}

// hashLoop hashes what readPiece received while writeLoop writes it, so
// receiving, hashing and writing each get a core.
func (pc *peerConn) hashLoop() {
	h := pc.f.newHasher()
	for j := range pc.hashCh {
		if j.first {
			h.Reset()
		}
		if !pc.bad.Load() {
			_, _ = h.Write(j.buf) // a hash.Hash never fails a Write
		}
		if j.last {
			// Requested only after the peer announced it with its hash.
			want := pc.f.s.pieceHash(j.piece)
			pc.sums <- pieceSum{ok: want != nil && bytes.Equal(h.Sum(nil), want), crc: h.crc()}
		}
		pc.done(j)
	}
}

// writeLoop writes chunks at their offset and, once a piece is both written
// and hashed, records it as verified or bans the peer.
func (pc *peerConn) writeLoop() {
	f := pc.f
	for j := range pc.writeCh {
		if !pc.bad.Load() {
			if err := f.s.writeAt(j.buf, j.off); err != nil {
				f.cancel(err)
				pc.bad.Store(true)
			}
		}
		pc.done(j)
		if j.last {
			sum := <-pc.sums
			pc.settle(j.piece, sum.ok, sum.crc)
		}
	}
}

// fileHashLoop checks the pieces splicePiece put in the file by hashing them
// from the page cache, and settles them.
func (pc *peerConn) fileHashLoop(ctx context.Context) {
	f := pc.f
	h := f.newHasher()
	for i := range pc.fileCh {
		ok := false
		if !pc.bad.Load() {
			off, n := f.s.m.PieceRange(i)
			h.Reset()
			err := f.s.withFile(func(file *os.File) error { return hashFile(ctx, h, file, off, n, f.n.recv) })
			if err != nil {
				f.cancel(err)
				pc.bad.Store(true)
			} else {
				// Requested only after the peer announced it with its hash.
				want := f.s.pieceHash(i)
				ok = want != nil && bytes.Equal(h.Sum(nil), want)
			}
		}
		pc.settle(i, ok, h.crc())
	}
}

// pieceSum is what hashing a received piece found.
type pieceSum struct {
	ok  bool
	crc *uint64
}

// settle decides a received piece once it is both stored and hashed: it
// counts only if its hash matched; a mismatch bans the peer; once the
// connection is being dropped the piece just goes back to the pool.
func (pc *peerConn) settle(i int, ok bool, crc *uint64) {
	f := pc.f
	switch {
	case pc.bad.Load():
		f.release(i)
	case ok:
		f.verified(i, true, crc)
	default:
		pc.bad.Store(true)
		f.failed.Add(1)
		f.n.c.failed.Add(1)
		f.n.log.Warn("p2p: peer sent a bad piece, banning it", "peer", pc.id, "addr", pc.addr, "shard", f.s.m.ShardID, "piece", i)
		f.n.Ban(pc.id)
		pc.c.Close()
		f.release(i)
	}
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
