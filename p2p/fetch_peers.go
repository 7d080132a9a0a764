package p2p

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

func (f *fetch) peerLoop(ctx context.Context, wg *sync.WaitGroup) {
	t := time.NewTicker(f.o.PeerRefresh)
	defer t.Stop()
	for {
		now := f.n.cfg.Now()
		for addr, want := range peerTargets(f.o.Peers) {
			f.mu.Lock()
			_, busy := f.conns[addr]
			skip := busy || now.Before(f.retryAt[addr])
			if !skip {
				f.conns[addr] = nil // reserved while dialing
			}
			f.mu.Unlock()
			if skip {
				continue
			}
			wg.Go(func() { f.runPeer(ctx, addr, want) })
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
	peer    peerIdentity
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
	// leaving is set, under f.mu, once the peer is told the shard is
	// complete (leave): no request may follow.
	leaving bool
}

// peerTargets lists the addresses of src, each with the node ID expected
// there ("" when src does not say).
func peerTargets(src PeerSource) map[string]string {
	out := map[string]string{}
	if named, ok := src.(NamedPeerSource); ok {
		for id, addr := range named.NamedPeers() {
			out[addr] = id
		}
		return out
	}
	for _, addr := range src.Peers() {
		out[addr] = ""
	}
	return out
}

// dial connects to the member at addr, expected to be node want ("": any).
func (f *fetch) dial(ctx context.Context, addr, want string) (net.Conn, peerIdentity, error) {
	release, err := f.n.dials.acquire(ctx, addr)
	if err != nil {
		return nil, peerIdentity{}, err
	}
	defer release()
	d := net.Dialer{Deadline: f.n.cfg.Now().Add(f.n.cfg.DialTimeout)}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, peerIdentity{}, err
	}
	// The member gives the handshake as long (Config.HandshakeTimeout):
	// giving up first would lose both sides' work.
	c, peer, err := f.n.auth.client(raw, f.n.cfg.Now().Add(f.n.cfg.HandshakeTimeout), want)
	if err != nil {
		f.n.countRefusal(err)
		if errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrIdentity) {
			f.n.log.Warn("p2p: peer failed authentication", "addr", addr, "err", err)
		}
		raw.Close()
		return nil, peerIdentity{}, err
	}
	f.n.c.dialed.Add(1)
	return c, peer, nil
}

func (f *fetch) runPeer(ctx context.Context, addr, want string) {
	backoff := redialBackoff
	defer func() { f.dropAddr(addr, backoff) }()
	mc, fr, backoff, err := f.subscribe(ctx, addr, want)
	if err != nil {
		f.n.log.Debug("p2p: subscribe failed", "addr", addr, "err", err)
		return
	}
	if fr.typ != msgBitfield {
		// Not open there (yet): gossip may list the peer a moment before it
		// opens the shard, so ask again at the next refresh, on this
		// connection if it is still kept then.
		if fr.typ == msgNotFound {
			f.n.c.notOpen.Add(1)
			f.n.idle.put(mc)
		} else {
			mc.c.Close()
		}
		backoff = f.o.PeerRefresh
		return
	}
	c, br, peer, id := mc.c, mc.br, mc.peer, mc.peer.ID
	keep := false
	defer func() {
		if keep {
			_ = c.SetReadDeadline(time.Time{})
			f.n.idle.put(mc)
		} else {
			c.Close()
		}
	}()
	has, err := f.learnBitfield(fr.payload)
	if err != nil {
		f.n.log.Warn("p2p: bad bitfield, banning peer", "peer", peer, "err", err)
		f.n.banPeer(peer)
		backoff = f.n.cfg.BanDuration
		return
	}
	pc := &peerConn{f: f, addr: addr, peer: peer, c: c, br: br, has: has,
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
	// One connection per peer, by the key it proved: a node reachable at
	// two addresses is asked once, and no one can take its place by
	// naming it.
	who := string(peer.Key)
	f.mu.Lock()
	if f.byKey[who] != nil {
		f.mu.Unlock()
		return // already connected to this node under another address
	}
	f.conns[addr], f.byKey[who] = pc, pc
	for i := range f.st.avail {
		if has.Has(i) {
			f.st.avail[i]++
		}
	}
	f.bump()
	f.mu.Unlock()
	f.n.c.connected.Add(1)
	defer f.n.c.connected.Add(-1)

	// The end of the fetch ends the connection, unless the shard is
	// complete: then the peer is told to send nothing more of it, and the
	// connection is kept for the next exchange once it says so.
	left := make(chan bool, 1)
	stop := context.AfterFunc(ctx, func() {
		ok := errors.Is(context.Cause(ctx), errFetchDone) && pc.leave()
		if !ok {
			c.Close()
		}
		left <- ok
	})
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
	if !stop() {
		keep = <-left && errors.Is(err, errLeft)
	}
	if !keep {
		c.Close()
	}
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
	delete(f.byKey, who)
	f.bump()
	f.mu.Unlock()
	if errors.Is(err, errProtocol) {
		f.n.log.Warn("p2p: dropping peer", "peer", id, "err", err)
	} else {
		f.n.log.Debug("p2p: peer connection ended", "peer", id, "err", err)
	}
	if f.n.Banned(peer.Key) {
		keep = false
		backoff = f.n.cfg.BanDuration
	}
}

// errLeft ends a connection's read loop once the peer acknowledged that
// nothing more of the shard follows (msgUnsubscribed).
var errLeft = errors.New("p2p: left the shard")

// leave tells the peer, once the shard is complete, to send nothing more
// of it, unless a request to it is still unanswered (the connection then
// ends). A piece still pending may be verified already: its last bytes are
// in and the read loop has yet to take it off pending. No request goes out
// after leave; the read loop ends with errLeft at the peer's
// acknowledgement.
func (pc *peerConn) leave() bool {
	f := pc.f
	have := f.s.Have()
	f.mu.Lock()
	answered := !pc.bad.Load()
	for _, i := range pc.pending {
		answered = answered && have.Has(i)
	}
	if !answered {
		f.mu.Unlock()
		return false
	}
	pc.leaving = true
	f.mu.Unlock()
	_ = pc.c.SetReadDeadline(f.n.cfg.Now().Add(f.n.cfg.StallTimeout))
	_ = pc.c.SetWriteDeadline(f.n.cfg.Now().Add(f.n.cfg.StallTimeout))
	defer func() { _ = pc.c.SetWriteDeadline(time.Time{}) }()
	return writeFrame(pc.c, msgUnsubscribe, nil) == nil
}

// subscribe asks the member at addr (expected to be node want) for the
// shard, on a kept connection to it or a new one, and returns the
// connection with the first answer; on error, the backoff before the next
// try, the connection closed.
func (f *fetch) subscribe(ctx context.Context, addr, want string) (*memberConn, frame, time.Duration, error) {
	for {
		mc, kept, err := f.n.connect(ctx, addr, want, 64<<10)
		if err != nil {
			return nil, frame{}, redialBackoff, err
		}
		if mc.peer.ID == f.n.cfg.NodeID {
			mc.c.Close()
			return nil, frame{}, time.Hour, errors.New("p2p: our own address")
		}
		if f.n.Banned(mc.peer.Key) {
			mc.c.Close()
			return nil, frame{}, f.n.cfg.BanDuration, fmt.Errorf("p2p: %s is banned", mc.peer)
		}
		stop := context.AfterFunc(ctx, func() { mc.c.Close() })
		fr, err := f.askShard(mc)
		if !stop() {
			err = errors.Join(context.Cause(ctx), err)
		} else if err == nil {
			return mc, fr, redialBackoff, nil
		}
		mc.c.Close()
		if kept && ctx.Err() == nil {
			continue // closed on the member's side meanwhile: subscribe on a new connection
		}
		return nil, frame{}, f.o.PeerRefresh, err
	}
}

// askShard sends the subscription on mc and reads the answer.
func (f *fetch) askShard(mc *memberConn) (frame, error) {
	if err := writeFrame(mc.c, msgSubscribe, append(f.s.skel[:], f.s.m.ShardID...)); err != nil {
		return frame{}, err
	}
	_ = mc.c.SetReadDeadline(f.n.cfg.Now().Add(f.n.cfg.DialTimeout))
	fr, err := readFrameMax(mc.br, maxBitfieldFrame)
	_ = mc.c.SetReadDeadline(time.Time{})
	return fr, err
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
		for wait <= 0 && !pc.leaving && len(pc.pending) < f.o.RequestDepth {
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
// deadline armed exactly while something is outstanding: a request, or
// the acknowledgement of leave.
func (pc *peerConn) popPending(i int) error {
	f := pc.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(pc.pending) == 0 || pc.pending[0] != i {
		return fmt.Errorf("%w: answer for piece %d not asked for next", errProtocol, i)
	}
	pc.pending = pc.pending[1:]
	if len(pc.pending) == 0 && !pc.leaving {
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
				f.n.log.Warn("p2p: peer announced a conflicting piece hash, banning it", "peer", pc.peer, "shard", f.s.m.ShardID, "piece", i)
				f.n.banPeer(pc.peer)
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
		case msgUnsubscribed:
			f.mu.Lock()
			leaving := pc.leaving
			f.mu.Unlock()
			if !leaving {
				return fmt.Errorf("%w: unsubscribed without leaving", errProtocol)
			}
			return errLeft
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
		f.n.log.Warn("p2p: peer sent a bad piece, banning it", "peer", pc.peer, "addr", pc.addr, "shard", f.s.m.ShardID, "piece", i)
		f.n.banPeer(pc.peer)
		pc.c.Close()
		f.release(i)
	}
}
