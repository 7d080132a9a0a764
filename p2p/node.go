package p2p

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Config configures a Node. Zero values get the defaults noted.
type Config struct {
	// NodeID names this node to its peers (1-255 bytes).
	NodeID string
	// Identity is this node's identity key (LoadIdentity), which proves
	// its NodeID in every handshake; nil makes a new one for the life of
	// the Node, which peers that pinned an earlier one refuse.
	Identity ed25519.PrivateKey
	// PeerKeys, if set, says which identity key each node ID is known by
	// (the fleet's gossip carries them): a peer is accepted only under the
	// ID its key is pinned to. Nil: the Node pins each ID to the first key
	// it sees for it, for its lifetime.
	PeerKeys KeyDirectory
	// ClusterKey is the 32-byte secret shared by every fleet member.
	ClusterKey []byte
	// Keyring, if set, replaces ClusterKey with the fleet's current keys
	// (the one to dial with first; all are accepted), read at every
	// handshake, so the swarm follows a key rotation.
	Keyring func() [][]byte
	// Encrypt wraps connections in TLS 1.3 and binds the handshake, which
	// authenticates both ends, to the TLS session. Off, the
	// handshake is the same but the bulk bytes go in the clear with sendfile,
	// and an attacker on the path can read them or take over the connection
	// once it is authenticated; pieces are verified against the manifest
	// either way. Every node of a fleet must agree.
	Encrypt bool
	// MaxUploads caps pieces served at once (default 4); further requests get
	// a busy answer so local readers and our own downloads keep their share.
	MaxUploads int
	// UploadLimit and DownloadLimit cap peer traffic in bytes per second
	// (0: unlimited). Origin reads are not counted against DownloadLimit.
	UploadLimit, DownloadLimit float64
	// MaxConns caps authenticated connections accepted from members
	// (default 256).
	MaxConns int
	// MaxHandshakes caps accepted connections still in their handshake, not
	// yet proven members (default 64), and MaxHandshakesPerSource those of
	// them from one address (default 8); further connections are closed
	// at once. Members' connections pass the handshake in a round trip or
	// two, so a few slots serve them, and strangers that connect and stall
	// hold only these, never MaxConns.
	MaxHandshakes, MaxHandshakesPerSource int
	// HandshakeTimeout cuts a handshake not completed in this time, on
	// either side (default 10s). A member's handshake is a
	// few round trips and a few signatures, but on a node whose CPU is
	// taken (by its transfers, or by neighbours on a shared host) each
	// step waits its turn to run, on both sides: a deadline shorter than
	// that throws away the handshake's work on both sides and the peer
	// dials again, which takes more of the CPU that was short. Strangers
	// that stall still hold only the handshake slots (MaxHandshakes), for
	// at most this long.
	HandshakeTimeout time.Duration
	// RefusedHold is how long a connection refused for a full handshake
	// budget is held, unread, before it is reset (default 1s).
	RefusedHold time.Duration
	// ReceiveBuffers bounds the 64 KiB buffers holding piece bytes between
	// the socket, the hasher and the disk, over all connections that cannot
	// splice (TLS), default 64 (4 MiB).
	ReceiveBuffers int
	// DialTimeout bounds the connection to a member, before the handshake
	// (default 3s): a member that is up accepts it in its kernel, however
	// busy it is.
	DialTimeout time.Duration
	// StallTimeout abandons a peer that sends nothing for this long while we
	// wait for a piece (default 10s); its pieces go back to the pool.
	StallTimeout time.Duration
	// BanDuration is how long a peer that sent a bad piece is refused, by
	// its identity key (default 1h).
	BanDuration time.Duration
	Logger      *slog.Logger
	// Now is the clock used for bans and origin fallback (default time.Now).
	Now func() time.Time
}

// Stats are cumulative counters of a node, for metrics.
type Stats struct {
	OriginBytes    int64 // bytes read from origin byte sources
	PeerBytesIn    int64 // piece bytes received from peers
	PeerBytesOut   int64 // piece bytes sent to peers
	PiecesVerified int64 // pieces that matched their hash
	PiecesFailed   int64 // pieces that did not
	PeersConnected int64 // authenticated connections now open, both directions
	PeersBanned    int64 // bans issued
	AuthFailures   int64 // handshakes that failed authentication, either side
	// IdentityRefusals counts handshakes refused because the peer proved a
	// key other than the one its node ID is pinned to, or answered under
	// another ID than the one dialed, either side.
	IdentityRefusals int64
	// ConnsRefused counts accepted connections closed unheard because the
	// handshake or member budget was full.
	ConnsRefused int64
	// HandshakesDialed and HandshakesAccepted count the handshakes that
	// made a member connection, as the dialer and as the acceptor: each
	// cost both sides a TLS and an identity handshake.
	HandshakesDialed, HandshakesAccepted int64
	// SubscribesNotOpen counts this node's subscriptions a member answered
	// with "not open here" (it had not opened the shard yet).
	SubscribesNotOpen int64
}

type counters struct {
	originBytes, peerIn, peerOut, verified, failed, connected, banned, authFail, identity, refused atomic.Int64
	dialed, accepted, notOpen                                                                      atomic.Int64
}

// refusalLogEvery is the least time between two log lines about refused or
// failed connections.
const refusalLogEvery = 10 * time.Second

// Node is one member of the swarm: it serves the shards opened on it and
// fetches them from peers and origins.
type Node struct {
	cfg     Config
	log     *slog.Logger
	auth    *auth
	uploads chan struct{}
	upLim   *rate.Limiter
	downLim *rate.Limiter
	conns   chan struct{}
	hello   *admission
	dials   *dialGate // this node's handshakes towards each member (see admit.go)
	// held are the refused connections waiting to be reset (see refuse),
	// each with the timer that resets it.
	heldMu sync.Mutex
	held   map[net.Conn]*time.Timer
	// refusedLog and failedLog report refused connections and failed
	// handshakes, a line per refusalLogEvery at most.
	refusedLog, failedLog *throttledLog
	recv                  *bufPool
	sendBufs              *bufPool // one per upload slot, for connections without sendfile
	c                     counters
	mu                    sync.Mutex
	shards                map[string]*Shard            // by ShardID: the one served
	twins                 map[string][]*Shard          // by ShardID: more files of the same shard
	bans                  map[string]time.Time         // identity key -> until
	pins                  map[string]ed25519.PublicKey // node ID -> first key seen, without PeerKeys
	serveWG               sync.WaitGroup
	idle                  idlePool      // member connections kept for the next exchange (see memberconn.go)
	idleWait              chan struct{} // connections waiting for a member's next exchange
	// opened is closed (and replaced) under mu whenever a shard ID opens
	// here: manifest asks held until then (WaitManifest) wake on it.
	opened chan struct{}
	// askWaits holds a slot per manifest ask held for its shard to open.
	askWaits chan struct{}
}

// chunkSize is the unit of reads, writes, hashing and rate limiting.
const chunkSize = 256 << 10

// copyBufSize is the size of the buffers piece bytes pass through in user
// space where the kernel cannot move them (TLS; splice elsewhere than
// Linux): an upload reads the file into one and writes it to the
// connection, a download reads into one and hands it to the hasher and the
// disk. A TLS record holds at most 16 KiB, so larger buffers save only a
// few system calls, while every buffer a node allocates stays in its heap
// and, with Go's collector, counts about twice in its memory.
const copyBufSize = 64 << 10

// NewNode checks cfg and builds a node; call Serve to accept peers.
func NewNode(cfg Config) (*Node, error) {
	keys := cfg.Keyring
	if keys == nil {
		key := cfg.ClusterKey
		keys = func() [][]byte { return [][]byte{key} }
	}
	a, err := newAuth(cfg.NodeID, keys, cfg.Encrypt)
	if err != nil {
		return nil, err
	}
	if cfg.Identity != nil {
		if len(cfg.Identity) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("p2p: identity key of %d bytes, want %d", len(cfg.Identity), ed25519.PrivateKeySize)
		}
		a.priv = cfg.Identity
	}
	if cfg.UploadLimit < 0 || cfg.DownloadLimit < 0 {
		return nil, errors.New("p2p: negative rate limit")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.DialTimeout, 3*time.Second)
	def(&cfg.StallTimeout, 10*time.Second)
	def(&cfg.BanDuration, time.Hour)
	def(&cfg.HandshakeTimeout, 10*time.Second)
	def(&cfg.RefusedHold, time.Second)
	if cfg.MaxHandshakes <= 0 {
		cfg.MaxHandshakes = 64
	}
	if cfg.MaxHandshakesPerSource <= 0 {
		cfg.MaxHandshakesPerSource = 8
	}
	if cfg.MaxUploads <= 0 {
		cfg.MaxUploads = 4
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 256
	}
	if cfg.ReceiveBuffers <= 0 {
		cfg.ReceiveBuffers = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger.With("node", cfg.NodeID)
	throttled := func(level slog.Level, msg string) *throttledLog {
		return &throttledLog{log: log, level: level, msg: msg, every: refusalLogEvery, now: cfg.Now}
	}
	n := &Node{
		cfg:        cfg,
		log:        log,
		hello:      newAdmission(cfg.MaxHandshakes, cfg.MaxHandshakesPerSource),
		dials:      newDialGate(cfg.MaxHandshakesPerSource),
		refusedLog: throttled(slog.LevelWarn, "p2p: refusing connections"),
		failedLog:  throttled(slog.LevelInfo, "p2p: refused connection"),
		auth:       a,
		uploads:    make(chan struct{}, cfg.MaxUploads),
		upLim:      limiter(cfg.UploadLimit),
		downLim:    limiter(cfg.DownloadLimit),
		conns:      make(chan struct{}, cfg.MaxConns),
		recv:       newBufPool(cfg.ReceiveBuffers, copyBufSize),
		sendBufs:   newBufPool(cfg.MaxUploads, copyBufSize),
		shards:     map[string]*Shard{},
		twins:      map[string][]*Shard{},
		held:       map[net.Conn]*time.Timer{},
		bans:       map[string]time.Time{},
		pins:       map[string]ed25519.PublicKey{},
		idle:       idlePool{idle: map[string][]*memberConn{}},
		idleWait:   make(chan struct{}, idleConns),
		opened:     make(chan struct{}),
		askWaits:   make(chan struct{}, askWaitsMax),
	}
	a.trust = n.trustPeer
	return n, nil
}

func limiter(bps float64) *rate.Limiter {
	if bps == 0 {
		return rate.NewLimiter(rate.Inf, 0)
	}
	return rate.NewLimiter(rate.Limit(bps), chunkSize)
}

// Stats returns a snapshot of the node's counters.
func (n *Node) Stats() Stats {
	return Stats{
		OriginBytes:        n.c.originBytes.Load(),
		PeerBytesIn:        n.c.peerIn.Load(),
		PeerBytesOut:       n.c.peerOut.Load(),
		PiecesVerified:     n.c.verified.Load(),
		PiecesFailed:       n.c.failed.Load(),
		PeersConnected:     n.c.connected.Load(),
		PeersBanned:        n.c.banned.Load(),
		AuthFailures:       n.c.authFail.Load(),
		IdentityRefusals:   n.c.identity.Load(),
		ConnsRefused:       n.c.refused.Load(),
		HandshakesDialed:   n.c.dialed.Load(),
		HandshakesAccepted: n.c.accepted.Load(),
		SubscribesNotOpen:  n.c.notOpen.Load(),
	}
}

// PublicKey is this node's identity key, for peers to pin its NodeID to.
func (n *Node) PublicKey() ed25519.PublicKey {
	return n.auth.priv.Public().(ed25519.PublicKey)
}

// Ban refuses the peer holding identity key until the ban expires.
func (n *Node) Ban(key ed25519.PublicKey) {
	n.mu.Lock()
	n.bans[string(key)] = n.cfg.Now().Add(n.cfg.BanDuration)
	n.mu.Unlock()
	n.c.banned.Add(1)
}

// Banned reports whether the peer holding identity key is refused.
func (n *Node) Banned(key ed25519.PublicKey) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	until, ok := n.bans[string(key)]
	if ok && !n.cfg.Now().Before(until) {
		delete(n.bans, string(key))
		return false
	}
	return ok
}

// Serve accepts peers on ln until ctx ends, then closes ln and waits for
// the connections it started and for the close: nothing it started runs
// once it returns.
func (n *Node) Serve(ctx context.Context, ln net.Listener) error {
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(closed)
		ln.Close()
	})
	defer func() {
		if !stop() {
			<-closed
		}
	}()
	defer n.closeHeld()
	defer n.serveWG.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("p2p: accept: %w", err)
		}
		src := sourceOf(c)
		if ok, why := n.hello.admit(src); !ok {
			n.refuse(c, why, true)
			continue
		}
		n.serveWG.Add(1)
		go func() {
			defer n.serveWG.Done()
			n.serveConn(ctx, c, src)
		}()
	}
}

// refuse closes a connection unheard, for why. A stranger's is held for
// RefusedHold first (up to maxRefusedHeld at once, no goroutine each): one
// that reconnects as soon as it is refused then costs both sides a
// connection per RefusedHold, not as many as the CPUs can turn over.
func (n *Node) refuse(c net.Conn, why string, stranger bool) {
	n.c.refused.Add(1)
	n.refusedLog.Log("why", why, "remote", c.RemoteAddr())
	if tc, ok := c.(*net.TCPConn); ok {
		// A reset, not a close: refusals leave no TIME_WAIT socket behind
		// on this side.
		_ = tc.SetLinger(0)
	}
	if stranger && n.hold(c) {
		return
	}
	c.Close()
}

// hold keeps a refused connection open for RefusedHold, or says it cannot
// (maxRefusedHeld are held already).
func (n *Node) hold(c net.Conn) bool {
	n.heldMu.Lock()
	defer n.heldMu.Unlock()
	if len(n.held) >= maxRefusedHeld {
		return false
	}
	n.held[c] = time.AfterFunc(n.cfg.RefusedHold, func() {
		n.heldMu.Lock()
		delete(n.held, c)
		n.heldMu.Unlock()
		c.Close()
	})
	return true
}

// closeHeld resets the refused connections still held, when Serve returns.
func (n *Node) closeHeld() {
	n.heldMu.Lock()
	defer n.heldMu.Unlock()
	for c, t := range n.held {
		t.Stop()
		c.Close()
		delete(n.held, c)
	}
}

// maxRefusedHeld bounds the refused connections held open (see refuse):
// beyond it they are closed at once, so holding them costs at most this
// many file descriptors.
const maxRefusedHeld = 1024

// serveConn authenticates a connection holding a handshake slot from src,
// then moves it to a member's slot and answers the member's exchanges on it
// (serveMember).
func (n *Node) serveConn(ctx context.Context, raw net.Conn, src string) {
	defer raw.Close()
	// The end of ctx cuts the handshake too: Serve waits for this, and
	// must not wait out a stalled stranger's deadline.
	stopHandshake := context.AfterFunc(ctx, func() { raw.Close() })
	c, peer, err := n.auth.server(raw, n.cfg.Now().Add(n.cfg.HandshakeTimeout))
	stopHandshake()
	n.hello.done(src)
	if err != nil {
		n.countRefusal(err)
		n.failedLog.Log("remote", raw.RemoteAddr(), "err", err)
		return
	}
	n.c.accepted.Add(1)
	if n.Banned(peer.Key) {
		n.log.Info("p2p: refused banned peer", "peer", peer, "remote", raw.RemoteAddr())
		return
	}
	select {
	case n.conns <- struct{}{}:
		defer func() { <-n.conns }()
	default:
		n.refuse(c, "too many member connections", false)
		return
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	n.c.connected.Add(1)
	defer n.c.connected.Add(-1)

	n.serveMember(ctx, c, bufio.NewReaderSize(c, 4096), peer)
}

// serveShard answers a subscription: the shard's bitfield, then have
// notifications and the pieces asked for, until the downloader hangs up or
// leaves (msgUnsubscribe). It reports whether the connection may carry
// another exchange: after "not open here", or once the downloader left and
// was told that nothing more of this shard follows.
func (n *Node) serveShard(ctx context.Context, c net.Conn, br *bufio.Reader, peer peerIdentity, f frame) bool {
	peerID := peer.ID
	if len(f.payload) <= 32 {
		n.log.Info("p2p: bad subscribe", "peer", peerID, "err", fmt.Errorf("%w: short subscribe", errProtocol))
		return false
	}
	n.mu.Lock()
	s := n.shards[string(f.payload[32:])]
	n.mu.Unlock()
	if s == nil || string(s.skel[:]) != string(f.payload[:32]) {
		// Not open here, or cut into other pieces (another piece length or
		// algorithm): nothing to exchange.
		return writeFrame(c, msgNotFound, nil) == nil
	}
	sc := &serverConn{c: c, n: n, s: s, peer: peerID, wake: make(chan struct{}, 1)}
	if !s.subscribe(sc) {
		return writeFrame(c, msgNotFound, nil) == nil
	}
	done := make(chan struct{})
	var haves sync.WaitGroup
	haves.Go(func() { sc.sendHaves(done) })
	leave := sync.OnceFunc(func() {
		s.unsubscribe(sc)
		close(done)
		haves.Wait()
	})
	defer leave()

	for {
		f, err := readFrame(br)
		if err != nil {
			return false
		}
		switch f.typ {
		case msgRequest:
		case msgUnsubscribe:
			// Every request before it is answered (one at a time, above);
			// once no have can follow, the acknowledgement is the last
			// frame of this shard on the connection.
			leave()
			sc.wmu.Lock()
			defer sc.wmu.Unlock()
			return writeFrame(c, msgUnsubscribed, nil) == nil
		default:
			n.log.Info("p2p: unexpected frame from downloader", "peer", peerID, "type", f.typ)
			return false
		}
		i, err := f.index(s.m.NumPieces())
		if err != nil {
			n.log.Info("p2p: bad request", "peer", peerID, "err", err)
			return false
		}
		if err := sc.upload(ctx, i); err != nil {
			n.log.Debug("p2p: upload ended", "peer", peerID, "err", err)
			return false
		}
	}
}

// serveManifest answers a manifest request with the manifest of a verified
// (complete) shard, in progress when the shard is open with some pieces
// but not all, or not found: if the shard is not open, only after up to
// wait for it to open (see awaitShard).
func (n *Node) serveManifest(ctx context.Context, c net.Conn, peerID, shardID string, wait time.Duration) bool {
	s := n.awaitShard(ctx, shardID, wait)
	if s == nil {
		return writeFrame(c, msgNotFound, nil) == nil
	}
	if !s.Complete() {
		return writeFrame(c, msgInProgress, u32(s.Have().Count())) == nil
	}
	b, err := s.Manifest().MarshalBinary()
	if err != nil {
		n.log.Error("p2p: encode manifest", "shard", shardID, "err", err)
		return false
	}
	if err := writeFrame(c, msgManifest, b); err != nil {
		n.log.Debug("p2p: send manifest", "peer", peerID, "err", err)
		return false
	}
	return true
}

// ErrNoManifest reports that a peer holds no complete shard of that ID.
var ErrNoManifest = errors.New("p2p: peer has no manifest for that shard")

// ErrInProgress reports that a peer has the shard open and is filling it
// (its origin reading S3, or a peer downloading): its pieces can be fetched
// with OpenPartial before the manifest is complete.
var ErrInProgress = errors.New("p2p: peer is still filling that shard")

// uploadSlotWait is how long a request may wait for an upload slot before
// the downloader is told to ask elsewhere.
const uploadSlotWait = 500 * time.Millisecond

type serverConn struct {
	c    net.Conn
	n    *Node
	s    *Shard
	peer string
	wmu  sync.Mutex // one frame (and its piece bytes) at a time
	mu   sync.Mutex
	have []haveNote // pending have notifications
	wake chan struct{}
	// paced is the pacing rate last set on c (0: none yet). Only the
	// goroutine serving the connection's requests touches it.
	paced uint64
}

type haveNote struct {
	piece int
	hash  []byte
}

func (sc *serverConn) notify(i int, hash []byte) {
	sc.mu.Lock()
	sc.have = append(sc.have, haveNote{i, hash})
	sc.mu.Unlock()
	select {
	case sc.wake <- struct{}{}:
	default:
	}
}

func (sc *serverConn) sendHaves(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-sc.wake:
		}
		sc.mu.Lock()
		pending := sc.have
		sc.have = nil
		sc.mu.Unlock()
		for _, h := range pending {
			sc.wmu.Lock()
			err := writeFrame(sc.c, msgHave, append(u32(h.piece), h.hash...))
			sc.wmu.Unlock()
			if err != nil {
				sc.c.Close()
				return
			}
		}
	}
}

// pace has the kernel send this upload's next chunk at its share of the
// upload limit, as the uploads in progress now split it. The limiter alone
// lets each chunk go at once, and the kernel would send it at line rate:
// bursts that overflow the queue of whichever downlink several uploaders
// converge on, and drop the packets of everything else crossing it (that
// node's S3 reads among them).
func (sc *serverConn) pace() {
	n := sc.n
	share := uint64(float64(n.upLim.Limit()) / float64(max(1, len(n.uploads))))
	if share == sc.paced {
		return // the kernel has it: no system call per chunk
	}
	if err := setPacing(sc.c, share); err != nil {
		if !errors.Is(err, errors.ErrUnsupported) {
			n.log.Debug("p2p: cannot pace upload", "peer", sc.peer, "err", err)
		}
		return
	}
	sc.paced = share
}

func (sc *serverConn) upload(ctx context.Context, i int) error {
	n := sc.n
	t := time.NewTimer(uploadSlotWait)
	defer t.Stop()
	select {
	case n.uploads <- struct{}{}:
	case <-t.C:
		sc.wmu.Lock()
		defer sc.wmu.Unlock()
		return writeFrame(sc.c, msgBusy, u32(i))
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-n.uploads }()
	// sendfile needs no buffer; anything else (TLS) copies through one of
	// the upload slot's, so a node holds copy buffers per upload in
	// progress rather than per connection.
	var buf []byte
	if _, isTCP := sc.c.(*net.TCPConn); !isTCP {
		var err error
		if buf, err = n.sendBufs.get(ctx); err != nil {
			return err
		}
		defer n.sendBufs.put(buf)
	}
	f, release := sc.s.readFile(i)
	if f == nil {
		// Never requested legitimately: we only announce verified pieces.
		return fmt.Errorf("%w: request for piece %d we do not have", errProtocol, i)
	}
	defer release()
	off, size := sc.s.m.PieceRange(i)
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	// A downloader that takes nothing for StallTimeout is gone or frozen:
	// without a deadline its zero window would hold this upload slot (and
	// the file) forever. The deadline moves on with every chunk, the unit
	// the downloader's own stall timer counts in.
	defer func() { _ = sc.c.SetWriteDeadline(time.Time{}) }()
	_ = sc.c.SetWriteDeadline(n.cfg.Now().Add(n.cfg.StallTimeout))
	if err := writeFrame(sc.c, msgPiece, append(u32(i), u32(int(size))...)); err != nil {
		return err
	}
	// Uploads go a chunk at a time so the limiter can pace them and the
	// stall deadline follows progress.
	limited := n.upLim.Limit() != rate.Inf
	for done := int64(0); done < size; {
		k := min(chunkSize, size-done)
		if err := n.upLim.WaitN(ctx, int(min(k, math.MaxInt32))); err != nil {
			return err
		}
		if limited {
			sc.pace()
		}
		_ = sc.c.SetWriteDeadline(n.cfg.Now().Add(n.cfg.StallTimeout))
		w, err := sendRange(sc.c, f, off+done, k, buf)
		done += w
		n.c.peerOut.Add(w)
		if err != nil {
			return err
		}
	}
	return nil
}
