package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/errgroup"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/nvme"
	"github.com/warmfleet/warmfleet/p2p"
)

// Swarm settings. Shards are small enough that the first ones are built
// (pulled from S3 and hashed by their origin) early and the fleet starts
// swarming while the origins still read the rest; pieces are the unit of
// verification and of a peer request.
const (
	swarmShardSize  = 32 << 20
	swarmPieceSize  = 4 << 20
	manifestPoll    = 250 * time.Millisecond
	originFallback  = 2 * time.Minute  // no manifest from anyone this long: read S3 ourselves
	peerOriginAfter = 15 * time.Second // a non-origin reads S3 only when no peer delivers for this long
	swarmFetchSlots = 6
)

// Swarm is what the daemon needs from the peer-to-peer engine (p2p.Node).
type Swarm interface {
	Open(ctx context.Context, m *p2p.Manifest, path string, c p2p.Completion) (*p2p.Shard, error)
	Build(ctx context.Context, spec p2p.BuildSpec) (*p2p.Shard, error)
	FetchManifest(ctx context.Context, addr, shardID string) (*p2p.Manifest, error)
	Stats() p2p.Stats
}

// swarm is the daemon's use of a Swarm: where completions and manifests
// live, and one S3 build at a time so a node's origin reads go in order.
type swarm struct {
	p2p       Swarm
	completes p2p.Completion
	build     chan struct{}
	// fetching bounds the shards filled from peers at once: each holds a
	// connection and buffers per peer, and a few shards at a time already
	// keep the node's link busy.
	fetching chan struct{}

	mu      sync.Mutex
	seeding map[string][]*p2p.Shard // model name -> open shards served to peers
}

// SetSwarm makes the daemon fetch model files through the fleet's swarm:
// each shard is pulled from S3 once, by one origin node, and the others fill
// from peers. Needs a fleet (SetFleet). Call it before Run.
func (d *Daemon) SetSwarm(s Swarm) error {
	comp, err := p2p.NewBoltCompletion(d.state.db, "pieces")
	if err != nil {
		return err
	}
	d.swarm = &swarm{p2p: s, completes: comp, build: make(chan struct{}, 1), fetching: make(chan struct{}, swarmFetchSlots),
		seeding: map[string][]*p2p.Shard{}}
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

// useSwarm reports whether this fetch should go through the swarm: there
// is one, and another target node can take part.
func (f *fetch) useSwarm() bool {
	if f.d.swarm == nil || f.d.fleet == nil {
		return false
	}
	names, _ := f.swarmPeers()
	return len(names) > 1 || len(names) == 1 && names[0] != f.d.fleet.LocalName()
}

// fetchFileSwarm fills one file shard by shard through the swarm, then
// checks the whole file against what S3 says of the object.
func (f *fetch) fetchFileSwarm(ctx context.Context, stage *nvme.Staging, revision string, obj s3origin.Object, fr fileRecord) error {
	file, err := stage.OpenFile(fr.Path, fr.Size)
	if err != nil {
		return err
	}
	if fr.Size == 0 {
		return nil
	}
	ranges, err := p2p.SplitFile(fr.Size, swarmShardSize, swarmPieceSize)
	if err != nil {
		return err
	}
	path := filepath.Join(stage.Dir(), fr.Path)
	g, gctx := errgroup.WithContext(ctx)
	shards := make([]*p2p.Shard, len(ranges))
	for i, sr := range ranges {
		g.Go(func() error {
			s, err := f.fetchShard(gctx, revision, obj, fr, path, sr)
			shards[i] = s
			if err == nil {
				f.done.Add(sr.Length)
			}
			return err
		})
	}
	err = g.Wait()
	f.d.swarm.keep(f.spec.Name, shards)
	if err != nil {
		return fmt.Errorf("%s: %w", fr.Path, err)
	}
	v, err := f.d.origin.Verify(ctx, obj, file)
	if err != nil {
		return fmt.Errorf("%s: %w", fr.Path, err)
	}
	if !v.Verified {
		f.log.Info("file not verifiable end to end; every piece was verified", "file", fr.Path, "detail", v.Detail)
	}
	return nil
}

// fetchShard fills one shard: as its origin from S3, or from peers once
// some member holds it complete and can hand over its manifest.
func (f *fetch) fetchShard(ctx context.Context, revision string, obj s3origin.Object, fr fileRecord, path string, sr p2p.ShardRange) (*p2p.Shard, error) {
	sw := f.d.swarm
	id := fmt.Sprintf("%s/%s#%d", revision, fr.Path, sr.Index)
	source := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		return f.d.origin.OpenRange(ctx, obj, off, n)
	}
	self := f.d.fleet.LocalName()
	peerAddrs := p2p.PeerFunc(func() []string {
		names, addrs := f.swarmPeers()
		var out []string
		for _, n := range names {
			if n != self {
				out = append(out, addrs[n])
			}
		}
		return out
	})
	open := func(m *p2p.Manifest, originAfter time.Duration) (*p2p.Shard, error) {
		select {
		case sw.fetching <- struct{}{}:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		defer func() { <-sw.fetching }()
		s, err := sw.p2p.Open(ctx, m, path, sw.completes)
		if err != nil {
			return nil, err
		}
		if _, err := s.Fetch(ctx, p2p.FetchOptions{Peers: peerAddrs, Origin: source, OriginAfter: originAfter}); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	}
	if m, err := f.d.state.manifest(id); err != nil {
		return nil, err
	} else if m != nil {
		return open(m, peerOriginAfter) // resume what an earlier run began
	}
	start := f.d.now()
	for {
		names, addrs := f.swarmPeers()
		rank := p2p.Origin(id, names)
		// Whoever holds the shard complete hands over its manifest: a node
		// joining a warm fleet, or the next in rank after an origin died
		// mid-way, then reads nothing from S3.
		for _, name := range rank {
			if name == self {
				continue
			}
			m, err := sw.p2p.FetchManifest(ctx, addrs[name], id)
			if err != nil {
				continue // not built yet, or that member is gone: ask the next
			}
			if err := f.d.state.putManifest(id, m); err != nil {
				return nil, err
			}
			return open(m, peerOriginAfter)
		}
		if len(rank) == 0 || rank[0] == self || f.d.now().Sub(start) > originFallback {
			return f.buildShard(ctx, id, obj, fr, path, sr, source)
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(manifestPoll):
		}
	}
}

// buildShard pulls a shard from S3 as its origin, one build at a time per
// node so the node's first shards complete first.
func (f *fetch) buildShard(ctx context.Context, id string, obj s3origin.Object, fr fileRecord, path string, sr p2p.ShardRange, source p2p.ByteSource) (*p2p.Shard, error) {
	sw := f.d.swarm
	select {
	case sw.build <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-sw.build }()
	s, err := sw.p2p.Build(ctx, p2p.BuildSpec{ShardID: id, Name: fr.Path, Path: path, FileSize: fr.Size,
		Offset: sr.Offset, Length: sr.Length, PieceLength: swarmPieceSize, Source: source, Completion: sw.completes})
	if err != nil {
		return nil, err
	}
	if err := f.d.state.putManifest(id, s.Manifest()); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// keep holds a model's open shards so they are served to peers; they close
// when the model is removed or replaced.
func (sw *swarm) keep(model string, shards []*p2p.Shard) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	for _, s := range shards {
		if s != nil {
			sw.seeding[model] = append(sw.seeding[model], s)
		}
	}
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
		if keep != "" && len(s.Manifest().ShardID) > len(keep) && s.Manifest().ShardID[:len(keep)+1] == keep+"/" {
			kept = append(kept, s)
			continue
		}
		errs = append(errs, s.Close())
	}
	sw.seeding[model] = kept
	return errors.Join(errs...)
}

func (s *state) manifest(shardID string) (*p2p.Manifest, error) {
	var m *p2p.Manifest
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketManifests).Get([]byte(shardID))
		if b == nil {
			return nil
		}
		var err error
		m, err = p2p.DecodeManifest(b)
		return err
	})
	return m, err
}

func (s *state) putManifest(shardID string, m *p2p.Manifest) error {
	b, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketManifests).Put([]byte(shardID), b) })
}

// deleteManifests drops the manifests of a model's revisions but keep.
func (s *state) deleteManifests(revisions []string, keep string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketManifests)
		for _, rev := range revisions {
			if rev == "" || rev == keep {
				continue
			}
			if err := deletePrefix(b, []byte(rev+"/"), nil); err != nil {
				return err
			}
		}
		return nil
	})
}
