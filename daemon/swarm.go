package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/errgroup"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/nvme"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/p2p"
)

// Swarm settings. Shards are small enough that the first ones are built
// (pulled from S3 and hashed by their origin) early and the fleet starts
// swarming while the origins still read the rest; pieces are the unit of
// verification and of a peer request.
const (
	swarmShardSize = 32 << 20
	// swarmPieceSize is small because a piece travels on only once it is
	// whole: every relay hop and the first piece from S3
	// wait for a full piece. The 8-host cold bench (one S3 read per origin):
	// 4 MiB 51.6 s, 2 MiB 50.2 s, 1 MiB 50.3 s (medians of 4, 2 and 2
	// runs); on loopback 2 MiB costs the same CPU per GiB as 4 MiB.
	swarmPieceSize = 2 << 20
	manifestPoll   = 500 * time.Millisecond
	// manifestPollFirst is the first wait between polls; it doubles up to
	// manifestPoll, so a follower that asked before its origin opened the
	// shard subscribes before the first piece is in.
	manifestPollFirst = 100 * time.Millisecond
	// manifestWait is how long a follower asks its shard's origin to hold
	// an ask until it opens the shard (p2p.Node.WaitManifest): the origin
	// answers as it opens it, not up to a poll later. Short enough that the
	// follower still re-ranks and asks the others now and then.
	manifestWait       = 2 * time.Second
	manifestAsksAtOnce = 16               // asks of one poll in flight at once
	probeAllEvery      = 8                // polls: every member is asked every 8th, the origin alone (an ask held up to manifestWait) the others
	originFallback     = 2 * time.Minute  // no manifest from anyone this long: read S3 ourselves
	peerOriginAfter    = 15 * time.Second // a non-origin reads S3 only when no peer delivers for this long
	originWatch        = time.Second      // how often a follower checks whether it became the origin
	swarmFetchSlots    = 8
	// originReads is the S3 reads in flight per shard an origin builds.
	// One, so its pieces complete one after another and reach the fleet
	// early: eight origins sharing a 200 Mbit S3 link get ~3 MB/s each, so
	// a piece lands in half the time it takes beside a second read, and no
	// downlink has anything to carry until the first pieces land. The
	// 8-host bench with 4 MiB pieces: 51.6 s with one read vs 53.2 s with
	// two (medians of 4 and 6 runs, same session); four took 55.9 s.
	originReads = 1
)

// Swarm is what the daemon needs from the peer-to-peer engine (p2p.Node).
type Swarm interface {
	Open(ctx context.Context, m *p2p.Manifest, path string, c p2p.Completion) (*p2p.Shard, error)
	OpenPartial(ctx context.Context, m *p2p.Manifest, path string, c p2p.Completion) (*p2p.Shard, error)
	Build(ctx context.Context, spec p2p.BuildSpec) (*p2p.Shard, error)
	WaitManifest(ctx context.Context, addr, shardID string, wait time.Duration) (*p2p.Manifest, error)
	Stats() p2p.Stats
}

// swarm is the daemon's use of a Swarm: where completions and manifests
// live, and one S3 build at a time so a node's origin reads go in order.
type swarm struct {
	p2p       Swarm
	completes p2p.Completion
	build     chan struct{}
	// builds counts this node's S3 builds running or waiting for build:
	// while there are none, it helps other origins (p2p.FetchOptions.OriginHelp).
	builds atomic.Int32
	// fetching bounds the shards filled from peers at once: each holds a
	// connection and buffers per peer, and a few shards at a time already
	// keep the node's link busy.
	fetching chan struct{}

	mu      sync.Mutex
	seeding map[string][]*p2p.Shard // model name -> open shards served to peers
}

// useSwarm makes the daemon fetch model files through s (Deps.Swarm) and
// registers the swarm's metrics.
func (d *Daemon) useSwarm(s Swarm) error {
	comp, err := p2p.NewBoltCompletion(d.state.db, bucketPieces)
	if err != nil {
		return err
	}
	d.swarm = &swarm{p2p: s, completes: comp, build: make(chan struct{}, 1), fetching: make(chan struct{}, swarmFetchSlots),
		seeding: map[string][]*p2p.Shard{}}
	// Every byte the swarm reads, from S3 or a peer, it writes into a
	// shard's file in the cache.
	swarmWritten := func() int64 { st := s.Stats(); return st.OriginBytes + st.PeerBytesIn }
	d.metrics.swarmWritten.Store(&swarmWritten)
	stat := func(name, help string, counter bool, v func(p2p.Stats) float64, labels prometheus.Labels) prometheus.Collector {
		f := func() float64 { return v(s.Stats()) }
		if counter {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, f)
		}
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	for _, c := range []prometheus.Collector{
		stat("warmfleet_peer_bytes_total", "Bytes exchanged with peers.", true, func(s p2p.Stats) float64 { return float64(s.PeerBytesIn) }, prometheus.Labels{"direction": "in"}),
		stat("warmfleet_peer_bytes_total", "Bytes exchanged with peers.", true, func(s p2p.Stats) float64 { return float64(s.PeerBytesOut) }, prometheus.Labels{"direction": "out"}),
		stat("warmfleet_pieces_total", "Pieces checked against their manifest hash.", true, func(s p2p.Stats) float64 { return float64(s.PiecesVerified) }, prometheus.Labels{"result": "verified"}),
		stat("warmfleet_pieces_total", "Pieces checked against their manifest hash.", true, func(s p2p.Stats) float64 { return float64(s.PiecesFailed) }, prometheus.Labels{"result": "failed"}),
		stat("warmfleet_peers_connected", "Peer connections open.", false, func(s p2p.Stats) float64 { return float64(s.PeersConnected) }, nil),
		stat("warmfleet_peers_banned_total", "Peers banned for bad data.", true, func(s p2p.Stats) float64 { return float64(s.PeersBanned) }, nil),
		stat("warmfleet_peer_auth_failures_total", "Peer handshakes that failed authentication (a stranger without the cluster key, or with another), either side; on the dialing side also a member that hung up on our hello, which a member whose handshake slots are all taken does too.", true, func(s p2p.Stats) float64 { return float64(s.AuthFailures) }, nil),
		stat("warmfleet_peer_identity_refusals_total", "Peer handshakes refused because the peer proved an identity key other than the one the fleet pinned to its node name, or answered under another name than the one dialed, either side.", true, func(s p2p.Stats) float64 { return float64(s.IdentityRefusals) }, nil),
		stat("warmfleet_peer_handshakes_total", "Peer handshakes that made a member connection, by this node's side: each costs both sides a TLS and an identity handshake.", true, func(s p2p.Stats) float64 { return float64(s.HandshakesDialed) }, prometheus.Labels{"side": "dialed"}),
		stat("warmfleet_peer_handshakes_total", "Peer handshakes that made a member connection, by this node's side: each costs both sides a TLS and an identity handshake.", true, func(s p2p.Stats) float64 { return float64(s.HandshakesAccepted) }, prometheus.Labels{"side": "accepted"}),
		stat("warmfleet_peer_subscribes_not_open_total", "Shard subscriptions a member answered with not open there (yet).", true, func(s p2p.Stats) float64 { return float64(s.SubscribesNotOpen) }, nil),
		stat("warmfleet_peer_connections_refused_total", "Connections to the peer port closed unheard: the handshake or member budget was full.", true, func(s p2p.Stats) float64 { return float64(s.ConnsRefused) }, nil),
	} {
		if err := d.metrics.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// swarmPeers is the fleet as the swarm sees it: the spec's live target
// nodes that run a peer listener, by name, with their peer addresses.
func (f *fetch) swarmPeers() (names []string, addrs map[string]string) {
	members := f.d.fleet.Members()
	targets := gossip.Targets(f.spec, members)
	addrs = map[string]string{}
	for _, m := range members {
		if m.Meta.PeerAddr != "" && slices.Contains(targets, m.Name) {
			addrs[m.Name] = m.Meta.PeerAddr
			names = append(names, m.Name)
		}
	}
	return names, addrs
}

// resumeSettle is how long after its start a node that resumes a download
// waits to see another member before it decides how to fetch: two of
// gossip's rejoin rounds.
const resumeSettle = 10 * time.Second

// settleWait says how long a fetch should still wait for the fleet before
// choosing between the swarm and a direct download: only a node that
// resumes a download, sees no other member, and started less than settle
// ago waits. A whole fleet restarting at once (a power cut, a rollout)
// starts together, and most nodes' first join fails while the node they
// join is not up yet: deciding alone, each would read from S3 everything
// its peers could give it, or that its own verified pieces already hold.
func settleWait(resuming, alone bool, started, now time.Time, settle time.Duration) time.Duration {
	if !resuming || !alone {
		return 0
	}
	return max(started.Add(settle).Sub(now), 0)
}

// writerSettle bounds how long a fetch waits for the member that asked
// for the model to be seen again (see writerAway).
const writerSettle = 10 * time.Second

// writerAway reports whether writer, the member that wrote the spec's
// desired record, is a node this node sees gone (dead or left) or back
// without its inventory yet. It asked for the model, so it most likely
// holds it or is fetching it, and this node's view is behind: when a
// partition heals, the other side's desired records come in the same
// push/pull that tells a member it was declared dead, a moment before that
// member refutes it and is seen alive again. Ranked without it, this node
// took its shards as their origin and read from S3 what the other side
// already held (the partition-heal chaos scenario: the two sides re-read
// half of each other's model, every run). Unknown writers (never seen, or
// gone from the view) and routers are not waited for.
func writerAway(writer string, members []gossip.Member) bool {
	for _, m := range members {
		if m.Name == writer && !m.Self && m.Role == gossip.RoleNode {
			return m.State != gossip.MemberAlive || m.Inventory == nil
		}
	}
	return false
}

// awaitFleet waits, as settleWait says, for another target member to
// appear, and up to writerSettle while writerAway holds; it polls, since
// the fleet's change channel has one consumer.
func (f *fetch) awaitFleet(ctx context.Context, resuming bool) {
	if f.d.swarm == nil || f.d.fleet == nil {
		return
	}
	const poll = 250 * time.Millisecond
	start := f.d.now()
	writer, _ := f.d.desired.Writer(f.spec.Key())
	logged := false
	for {
		now := f.d.now()
		wait := settleWait(resuming, !f.othersInSight(), f.d.started, now, resumeSettle)
		if writer != "" && writerAway(writer, f.d.fleet.Members()) {
			if w := start.Add(writerSettle).Sub(now); w > wait {
				wait = w
			}
			if !logged && wait > 0 {
				f.log.Info("waiting for the member that asked for the model to be seen again before fetching", "member", writer, "at_most", writerSettle)
				logged = true
			}
		}
		if wait <= 0 {
			return
		}
		t := time.NewTimer(min(wait, poll))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// useSwarm reports whether this fetch of revision should go through the
// swarm: there is one, and another target node can take part, or an
// earlier run of this node began the revision through it (a shard of it
// has a manifest or a stored layout, see putLayout). A restarted node may
// see no member yet (the whole fleet restarting at once): its shards'
// completion records still say which pieces it verified, which the swarm
// resumes from and a direct download would fetch again, and only a shard
// with a manifest is served to peers once complete.
func (f *fetch) useSwarm(revision string) (bool, error) {
	if f.d.swarm == nil || f.d.fleet == nil {
		return false, nil
	}
	if f.othersInSight() {
		return true, nil
	}
	return f.d.state.hasManifests(revision)
}

// othersInSight reports whether another target node of the spec can take
// part in the swarm.
func (f *fetch) othersInSight() bool {
	names, _ := f.swarmPeers()
	return len(names) > 1 || len(names) == 1 && names[0] != f.d.fleet.LocalName()
}

// fetchFileSwarm fills one file shard by shard through the swarm, then
// checks the whole file against what its origin says of the object.
func (f *fetch) fetchFileSwarm(ctx context.Context, stage *nvme.Staging, revision string, obj origin.Object, fr fileRecord) error {
	file, err := stage.OpenFile(fr.Path, fr.Size)
	if err != nil {
		return err
	}
	if fr.Size == 0 {
		return nil
	}
	path := filepath.Join(stage.Dir(), fr.Path)
	check, err := f.origin.NewRangeCheck(ctx, obj)
	if err != nil {
		return fmt.Errorf("%s: %w", fr.Path, err)
	}
	var pieceCRC func(uint64, []byte) uint64
	if check != nil {
		pieceCRC = check.Update
	}
	g, gctx := errgroup.WithContext(ctx)
	var mine []swarmShard
	for _, sh := range f.shards {
		if sh.file.Path == fr.Path {
			mine = append(mine, sh)
		}
	}
	shards := make([]*p2p.Shard, len(mine))
	spans := make([]fillSpan, len(mine))
	for i, sh := range mine {
		spans[i] = fillSpan{off: sh.rng.Offset, n: sh.rng.Length}
	}
	gate := newFillGate(spans)
	// Without a range check the origin reads the copy back: it does so
	// shard by shard as they complete (see fillGate), not after the fill.
	vctx, stopVerify := context.WithCancel(ctx)
	defer stopVerify()
	type verified struct {
		v   origin.Verification
		err error
	}
	readBack := make(chan verified, 1)
	if check == nil {
		go func() {
			v, err := f.origin.Verify(vctx, obj, gate.reader(vctx, file))
			readBack <- verified{v, err}
		}()
	}
	for i, sh := range mine {
		g.Go(func() error {
			s, err := f.fetchShard(gctx, obj, path, sh, pieceCRC)
			shards[i] = s
			if err == nil {
				f.done.Add(sh.rng.Length)
				gate.done(i)
			}
			return err
		})
	}
	err = g.Wait()
	f.d.swarm.keep(f.spec.Name, shards)
	if err != nil {
		if check == nil {
			stopVerify()
			<-readBack
		}
		return fmt.Errorf("%s: %w", fr.Path, err)
	}
	filled := f.d.now()
	var v origin.Verification
	if check != nil {
		var known []origin.RangeCRC
		for _, s := range shards {
			for _, p := range s.PieceCRCs() {
				known = append(known, origin.RangeCRC(p))
			}
		}
		v, err = check.Verify(ctx, file, known)
	} else {
		r := <-readBack
		v, err = r.v, r.err
	}
	if err != nil {
		return fmt.Errorf("%s: %w", fr.Path, err)
	}
	f.log.Debug("file filled through the swarm and checked", "file", fr.Path, "detail", v.Detail, "check", f.d.now().Sub(filled))
	if !v.Verified {
		f.log.Info("file not verifiable end to end; every piece was verified", "file", fr.Path, "detail", v.Detail)
	}
	return nil
}

// fetchShard fills one shard: as its origin from S3, from peers once some
// member holds it complete, or, while another member is still filling it,
// piece by piece as that member gets each piece.
func (f *fetch) fetchShard(ctx context.Context, obj origin.Object, path string, sh swarmShard, pieceCRC func(uint64, []byte) uint64) (*p2p.Shard, error) {
	sw := f.d.swarm
	spec := p2p.BuildSpec{ShardID: sh.id, Name: sh.file.Path, Path: path, FileSize: sh.file.Size,
		Offset: sh.rng.Offset, Length: sh.rng.Length, PieceLength: swarmPieceSize, Completion: sw.completes, Concurrency: originReads, PieceCRC: pieceCRC,
		Source: func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
			return f.origin.OpenRange(ctx, obj, off, n)
		},
		// Named: each dial says which member it means to reach.
		Peers: p2p.NamedPeerFunc(func() map[string]string {
			_, addrs := f.swarmPeers()
			delete(addrs, f.d.fleet.LocalName())
			return addrs
		}),
	}
	if s := sw.held(f.spec.Name, spec.ShardID, path); s != nil {
		// An earlier attempt of this run completed it, then failed on
		// another shard, and kept it open for peers: opening it again at
		// the same path would be refused.
		return s, nil
	}
	if m, err := f.d.state.manifest(spec.ShardID); err != nil {
		return nil, err
	} else if m != nil {
		return f.fillShard(ctx, spec, m) // resume what an earlier run began
	}
	if l, err := f.d.state.layout(spec.ShardID); err != nil {
		return nil, err
	} else if l != nil && l.Offset == spec.Offset && l.Length == spec.Length {
		// An earlier run began the shard: cut it as then, so the pieces
		// its completion record holds still count.
		spec.PieceLength, spec.Algo = l.PieceLength, l.Algo
	}
	self := f.d.fleet.LocalName()
	skeleton := spec.Skeleton().SkeletonID()
	start := f.d.now()
	polls := 0
	holders := f.readyHolders(sh.revision) // only the first poll asks them
	for {
		names, addrs := f.originCandidates()
		rank := f.originRank(spec.ShardID, names)
		probe := manifestAsks(rank, self, polls, holders)
		polls++
		inProgress, bypassed, refused := false, false, false
		asked := f.d.now()
		answers := f.askManifests(ctx, probe, addrs, spec.ShardID, askWait(probe, rank, self))
		for k, name := range probe {
			m, err := answers[k].m, answers[k].err
			if err == nil && m.SkeletonID() != skeleton {
				// Cut otherwise (another version's piece length), or a
				// member that lies: its sizes must not size our file.
				f.log.Warn("peer's manifest does not describe our shard", "peer", name, "shard", spec.ShardID)
				continue
			}
			switch {
			case err == nil:
				if err := f.d.state.putManifest(spec.ShardID, m); err != nil {
					return nil, err
				}
				return f.fillShard(ctx, spec, m)
			case errors.Is(err, p2p.ErrInProgress):
				inProgress = true
			case errors.Is(err, p2p.ErrNoManifest):
				bypassed = f.noteBypass(name, sh.revision) || bypassed
			case errors.Is(err, p2p.ErrUnauthenticated) && holders[name]:
				refused = true
			}
		}
		if bypassed && !inProgress {
			continue // rank again without it, at once
		}
		switch waited := f.d.now().Sub(start); {
		case readFromOrigin(rank, self, waited, refused):
			f.log.Debug("shard: reading it from S3 as its origin", "shard", spec.ShardID, "waited", waited, "rank", rank)
			return f.buildShard(ctx, spec)
		case inProgress:
			f.log.Debug("shard: following its origin", "shard", spec.ShardID, "waited", waited)
			return f.fillShard(ctx, spec, nil)
		}
		// An ask the origin held for its wait counts as the pause.
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(pollWait(polls) - f.d.now().Sub(asked)):
		}
	}
}

// holderPatience bounds how long a shard's origin goes on asking a member
// that gossip says holds the revision ready but that refused it as a
// stranger (p2p.ErrUnauthenticated): the two saw each other come back at
// different moments (a healed partition, a rejoin), and the holder admits
// this node once gossip tells it. Read from S3 at once, the shard came
// from S3 a second time (the partition-heal chaos scenario).
const holderPatience = 5 * time.Second

// readFromOrigin decides whether a shard's fetch reads it from S3 now:
// when no member may (rank empty), when this node waited for its origin
// longer than originFallback, or when this node is the origin, unless a
// holder refused it less than holderPatience ago.
func readFromOrigin(rank []string, self string, waited time.Duration, holderRefused bool) bool {
	switch {
	case len(rank) == 0 || waited > originFallback:
		return true
	case rank[0] != self:
		return false
	}
	return !holderRefused || waited > holderPatience
}

// askWait is how long a poll's asks may be held until the shard opens
// (p2p.Node.WaitManifest): manifestWait when it asks the shard's origin
// alone, the origin being another node, else 0. An ask of several members
// is answered once all are, and one held would hold back a member's
// complete manifest.
func askWait(probe, rank []string, self string) time.Duration {
	if len(probe) == 1 && len(rank) > 0 && probe[0] == rank[0] && rank[0] != self {
		return manifestWait
	}
	return 0
}

// bypassedSwarm reports whether a member that answered it has no manifest
// of a shard holds the shard's revision anyway: it fetched it directly from
// S3 (alone when it chose), or could not open the shard again after a
// restart. Either way it serves the shard to no one, and never will in this
// run, so a follower waiting for it as the shard's origin would wait for
// nothing.
func bypassedSwarm(noManifest bool, inv gossip.ModelInventory, revision string) bool {
	return noManifest && inv.Revision == revision && inv.State == gossip.StateReady
}

// noteBypass records, when bypassedSwarm says so of member name, that it
// takes no part in this fetch's swarm, and reports whether it does.
func (f *fetch) noteBypass(name, revision string) bool {
	for _, m := range f.d.fleet.Members() {
		if m.Name != name || m.Inventory == nil || !bypassedSwarm(true, m.Inventory.Models[f.spec.Name], revision) {
			continue
		}
		f.originsMu.Lock()
		defer f.originsMu.Unlock()
		if f.bypassed == nil {
			f.bypassed = map[string]bool{}
		}
		if !f.bypassed[name] {
			f.log.Info("a member holds the revision without serving it to the swarm; ranking the others as origins", "member", name)
		}
		f.bypassed[name] = true
		return true
	}
	return false
}

// originCandidates is swarmPeers less the members that bypassed the swarm:
// the ones that may read a shard from S3 for the fleet. The members'
// followers all see the same inventories, so they agree on the ranking.
func (f *fetch) originCandidates() (names []string, addrs map[string]string) {
	names, addrs = f.swarmPeers()
	f.originsMu.Lock()
	defer f.originsMu.Unlock()
	return slices.DeleteFunc(names, func(n string) bool { return f.bypassed[n] }), addrs
}

// manifestAsks returns whom poll number poll of a shard asks for its
// manifest, in rank order. Whoever holds the shard complete hands over its
// manifest: a node joining a warm fleet, or the next in rank after an origin
// died mid-way, then reads nothing from S3; whoever is filling it hands over
// its pieces as they come. The first poll asks the shard's origin and the
// members that gossip says hold the revision ready: on a cold start no one
// else can have it, and every node asking every member for every shard at
// once took ~0.3 s of handshakes before the first S3 read. While the origin
// has not started, asking it alone is enough: the others open a shard only
// after its origin did. Everyone is asked every probeAllEvery polls, and on
// every poll once this node ranks first, for when the ranking moved (a
// member joined or the origin left).
func manifestAsks(rank []string, self string, poll int, holders map[string]bool) []string {
	switch {
	case len(rank) == 0:
		return nil
	case poll == 0:
		return slices.DeleteFunc(slices.Clone(rank), func(name string) bool {
			return name != rank[0] && !holders[name] || name == self
		})
	case poll%probeAllEvery == 0 || rank[0] == self:
		return slices.DeleteFunc(slices.Clone(rank), func(name string) bool { return name == self })
	}
	return rank[:1]
}

// readyHolders returns the members whose inventory has the revision ready.
func (f *fetch) readyHolders(revision string) map[string]bool {
	out := map[string]bool{}
	for _, m := range f.d.fleet.Members() {
		if m.Inventory == nil {
			continue
		}
		if mi, ok := m.Inventory.Models[f.spec.Name]; ok && mi.Revision == revision && mi.State == gossip.StateReady {
			out[m.Name] = true
		}
	}
	return out
}

// pollWait is the wait after poll number polls (from 1): manifestPollFirst,
// doubling up to manifestPoll.
func pollWait(polls int) time.Duration {
	return min(manifestPoll, manifestPollFirst<<min(max(polls-1, 0), 8))
}

type manifestAnswer struct {
	m   *p2p.Manifest
	err error
}

// askManifests asks the named members (never this node: see manifestAsks)
// for a shard's manifest at once, not one round trip after another, each
// held up to wait for the shard to open there, and returns their answers in
// the order of names.
func (f *fetch) askManifests(ctx context.Context, names []string, addrs map[string]string, shardID string, wait time.Duration) []manifestAnswer {
	answers := make([]manifestAnswer, len(names))
	var wg sync.WaitGroup
	sem := make(chan struct{}, manifestAsksAtOnce)
	for k, name := range names {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			m, err := f.d.swarm.p2p.WaitManifest(ctx, addrs[name], shardID, wait)
			answers[k] = manifestAnswer{m, err}
		})
	}
	wg.Wait()
	return answers
}

// swarmShard is one shard of a revision: its fleet-wide ID, the file it
// belongs to and its range there.
type swarmShard struct {
	id, revision string
	file         fileRecord
	rng          p2p.ShardRange
}

// planShards cuts a revision's files into swarm shards, in file order;
// empty files have none. Every node cuts the same files the same way, which
// is what lets them agree on shard IDs and origins.
func planShards(revision string, files []fileRecord) ([]swarmShard, error) {
	var out []swarmShard
	for _, fr := range files {
		if fr.Size == 0 {
			continue
		}
		ranges, err := p2p.SplitFile(fr.Size, swarmShardSize, swarmPieceSize)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fr.Path, err)
		}
		for _, sr := range ranges {
			out = append(out, swarmShard{id: shardID(revision, fr.Path, sr.Index), revision: revision, file: fr, rng: sr})
		}
	}
	return out, nil
}

func shardID(revision, path string, index int) string {
	return fmt.Sprintf("%s/%s#%d", revision, path, index)
}

// originRank orders the spec's live target nodes for taking over a shard's
// S3 reads: its balanced origin (p2p.AssignOrigins over every shard of the
// revision) first, then rendezvous order.
func (f *fetch) originRank(id string, names []string) []string {
	key := strings.Join(slices.Sorted(slices.Values(names)), "\x00")
	f.originsMu.Lock()
	if f.originsKey != key || f.origins == nil {
		sizes := make([]p2p.ShardSize, len(f.shards))
		for i, sh := range f.shards {
			sizes[i] = p2p.ShardSize{ID: sh.id, Size: sh.rng.Length}
		}
		f.origins, f.originsKey = p2p.AssignOrigins(sizes, names), key
	}
	assigned := f.origins[id]
	f.originsMu.Unlock()
	return p2p.OriginRank(id, assigned, names)
}

// errBecameOrigin stops following a shard whose origin left when this node
// is next in rank: it then reads the rest from S3 itself.
var errBecameOrigin = errors.New("origin left; taking over the shard's S3 reads")

// fillShard fills a shard from peers: with its manifest, or without (m nil)
// while another member is still filling it, learning each piece hash with
// the piece. It falls back to S3 when no peer delivers for a while, and
// reads the rest from S3 at once if this node becomes the shard's origin.
func (f *fetch) fillShard(ctx context.Context, spec p2p.BuildSpec, m *p2p.Manifest) (*p2p.Shard, error) {
	sw := f.d.swarm
	select {
	case sw.fetching <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-sw.fetching }()
	var s *p2p.Shard
	var err error
	if m != nil {
		s, err = sw.p2p.Open(ctx, m, spec.Path, sw.completes)
	} else if err = f.d.state.putLayout(spec.ShardID, spec.Skeleton()); err == nil {
		s, err = sw.p2p.OpenPartial(ctx, spec.Skeleton(), spec.Path, sw.completes)
	}
	if err != nil {
		return nil, err
	}
	// Take over a partial shard's S3 reads only when the node that was
	// filling it left and this node is next in rank; a member joining
	// mid-way changes the ranking too, but the old origin carries on.
	self := f.d.fleet.LocalName()
	names, _ := f.originCandidates()
	following := ""
	if rank := f.originRank(spec.ShardID, names); len(rank) > 0 {
		following = rank[0]
	}
	takeOver := func() bool {
		names, _ := f.originCandidates()
		if slices.Contains(names, following) {
			return false
		}
		rank := f.originRank(spec.ShardID, names)
		if len(rank) == 0 {
			return false
		}
		following = rank[0]
		return following == self
	}
	originAfter := peerOriginAfter
	for {
		fctx, cancel := context.WithCancelCause(ctx)
		if originAfter > 0 && m == nil {
			go func() {
				for {
					select {
					case <-fctx.Done():
						return
					case <-time.After(originWatch):
					}
					if takeOver() {
						cancel(errBecameOrigin)
						return
					}
				}
			}()
		}
		opts := p2p.FetchOptions{Peers: spec.Peers, Origin: spec.Source, OriginAfter: originAfter, OriginConcurrency: spec.Concurrency, PieceCRC: spec.PieceCRC}
		if m == nil {
			// The shard is still being read from S3 (with a manifest, some
			// member holds it whole): help its origin once free.
			opts.OriginHelp = func() (int, int, bool) { return f.helpStripe(spec.ShardID, s) }
		}
		_, err = s.Fetch(fctx, opts)
		became := errors.Is(context.Cause(fctx), errBecameOrigin)
		cancel(nil)
		if err == nil {
			break
		}
		if !became || ctx.Err() != nil {
			s.Close()
			return nil, err
		}
		f.log.Info("taking over a shard whose origin left", "shard", spec.ShardID, "have", s.Have().Count())
		originAfter = 0
	}
	if m == nil {
		if err := f.d.state.putManifest(spec.ShardID, s.Manifest()); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// helpStripe says whether this node may help a shard's origin read S3, and
// which stripe of the shard's pieces is its own: only once its own S3
// builds are done, only while the origin follows the shard here (else it
// would not hear of the pieces read for it, and read them again), and then
// by its place in the shard's rank, so helpers never read the same piece.
func (f *fetch) helpStripe(shardID string, s *p2p.Shard) (stripe, stripes int, ok bool) {
	if f.d.swarm.builds.Load() > 0 {
		return 0, 0, false
	}
	names, _ := f.originCandidates()
	rank := f.originRank(shardID, names)
	k := slices.Index(rank, f.d.fleet.LocalName())
	if k < 1 || !s.Subscribed(rank[0]) {
		return 0, 0, false
	}
	return k - 1, len(rank) - 1, true
}

// buildShard pulls a shard from S3 as its origin, one build at a time per
// node so the node's first shards complete first. Peers get each piece as
// soon as it is in.
func (f *fetch) buildShard(ctx context.Context, spec p2p.BuildSpec) (*p2p.Shard, error) {
	sw := f.d.swarm
	sw.builds.Add(1)
	defer sw.builds.Add(-1)
	select {
	case sw.build <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	// The next build may start once this one's last reads are under way:
	// no gap in this origin's S3 reads, nor in the pieces its followers get.
	var release sync.Once
	done := func() { release.Do(func() { <-sw.build }) }
	defer done()
	spec.ReadsStarted = done
	if err := f.d.state.putLayout(spec.ShardID, spec.Skeleton()); err != nil {
		return nil, err
	}
	s, err := sw.p2p.Build(ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := f.d.state.putManifest(spec.ShardID, s.Manifest()); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// reseed opens the shards of every ready revision again after a restart,
// so the node serves what it holds: the fleet's joiners and stragglers
// count on it. Paths come from our own file records, never from a
// manifest. A shard whose completion does not cover it (its file changed
// on disk) stays closed; the revision itself is still verified and served
// locally.
func (d *Daemon) reseed(ctx context.Context) error {
	if d.swarm == nil {
		return nil
	}
	recs, err := d.state.records()
	if err != nil {
		return err
	}
	for name, rec := range recs {
		if rec.State != api.StateReady || rec.Path == "" {
			continue
		}
		plan, err := planShards(rec.RevisionID, rec.Files)
		if err != nil {
			return err
		}
		var shards []*p2p.Shard
		for _, sh := range plan {
			m, err := d.state.manifest(sh.id)
			if err != nil {
				return err
			}
			if m == nil {
				continue // fetched from S3 directly, or never finished
			}
			s, err := d.swarm.p2p.Open(ctx, m, filepath.Join(rec.Path, filepath.FromSlash(sh.file.Path)), d.swarm.completes)
			if err != nil {
				d.log.Warn("cannot serve shard", "model", name, "shard", sh.id, "err", err)
				continue
			}
			if !s.Complete() {
				s.Close()
				d.log.Warn("shard on disk no longer matches its record; not serving it", "model", name, "shard", sh.id)
				continue
			}
			shards = append(shards, s)
		}
		d.swarm.keep(name, shards)
		if len(shards) > 0 {
			d.log.Info("serving cached shards to peers", "model", name, "shards", len(shards))
		}
	}
	return nil
}

// keep holds a model's open shards so they are served to peers; they close
// when the model is removed or replaced. A shard held already (handed out
// again by held) is kept once.
func (sw *swarm) keep(model string, shards []*p2p.Shard) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	for _, s := range shards {
		if s != nil && !slices.Contains(sw.seeding[model], s) {
			sw.seeding[model] = append(sw.seeding[model], s)
		}
	}
}

// held returns the complete shard id that model holds open at path, if
// any. A held shard that is not complete, or whose file is no longer the
// one at path, is closed and forgotten, so the caller opens it afresh
// from its completion record (which names the file's identity).
func (sw *swarm) held(model, id, path string) *p2p.Shard {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	k := slices.IndexFunc(sw.seeding[model], func(s *p2p.Shard) bool { return s.ShardID() == id && s.Path() == path })
	if k < 0 {
		return nil
	}
	s := sw.seeding[model][k]
	if s.Complete() && s.HoldsFileAt(path) {
		return s
	}
	sw.seeding[model] = slices.Delete(sw.seeding[model], k, k+1)
	_ = s.Close()
	return nil
}

// release stops serving a model's shards except those of revision keep.
func (sw *swarm) release(model, keep string) error {
	if sw == nil {
		return nil
	}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	var errs []error
	var kept []*p2p.Shard
	for _, s := range sw.seeding[model] {
		if keep != "" && strings.HasPrefix(s.ShardID(), keep+"/") {
			kept = append(kept, s)
			continue
		}
		errs = append(errs, s.Close())
	}
	sw.seeding[model] = kept
	return errors.Join(errs...)
}

// manifest returns a shard's complete manifest, or nil.
func (s *state) manifest(shardID string) (*p2p.Manifest, error) {
	return s.readManifest(bucketManifests, shardID)
}

func (s *state) readManifest(bucket []byte, shardID string) (*p2p.Manifest, error) {
	var m *p2p.Manifest
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket).Get([]byte(shardID))
		if b == nil {
			return nil
		}
		var err error
		m, err = p2p.DecodeManifest(b)
		return err
	})
	return m, err
}

// hasManifests reports whether a shard of revision has a manifest, or a
// layout stored when it was opened without one: the swarm began it.
func (s *state) hasManifests(revision string) (bool, error) {
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		prefix := []byte(revision + "/")
		for _, b := range [][]byte{bucketManifests, bucketShards} {
			k, _ := tx.Bucket(b).Cursor().Seek(prefix)
			found = found || k != nil && bytes.HasPrefix(k, prefix)
		}
		return nil
	})
	return found, err
}

// putManifest stores a shard's complete manifest, which replaces its layout.
func (s *state) putManifest(shardID string, m *p2p.Manifest) error {
	b, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketShards).Delete([]byte(shardID)); err != nil {
			return err
		}
		return tx.Bucket(bucketManifests).Put([]byte(shardID), b)
	})
}

// putLayout stores the layout (a manifest without hashes) of a shard this
// node opens before its manifest is complete, so that a restart resumes it
// through the swarm, cut the same way.
func (s *state) putLayout(shardID string, skel *p2p.Manifest) error {
	skel = &p2p.Manifest{ShardID: skel.ShardID, Name: skel.Name, FileSize: skel.FileSize, Offset: skel.Offset,
		Length: skel.Length, PieceLength: skel.PieceLength, Algo: skel.Algo, Hashes: make([]byte, len(skel.Hashes))}
	b, err := skel.MarshalBinary()
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketShards).Put([]byte(shardID), b) })
}

// layout returns the layout putLayout stored for a shard, or nil.
func (s *state) layout(shardID string) (*p2p.Manifest, error) {
	return s.readManifest(bucketShards, shardID)
}

// deleteManifests drops the manifests (and layouts) of a model's revisions
// but keep, and but those another model still uses: models cached from identical files
// share their revision, and so their shards and manifests.
func (s *state) deleteManifests(model string, revisions []string, keep string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		inUse := map[string]bool{}
		err := tx.Bucket(bucketCaches).ForEach(func(k, v []byte) error {
			var rec cacheRecord
			if string(k) == model || json.Unmarshal(v, &rec) != nil {
				return nil // an unreadable record is reported where it is read
			}
			inUse[rec.RevisionID], inUse[rec.Updating] = true, true
			return nil
		})
		if err != nil {
			return err
		}
		for _, rev := range revisions {
			if rev == "" || rev == keep || inUse[rev] {
				continue
			}
			for _, b := range [][]byte{bucketManifests, bucketShards} {
				if err := deletePrefix(tx.Bucket(b), []byte(rev+"/"), nil); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
