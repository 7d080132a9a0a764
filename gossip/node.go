package gossip

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/desired"
)

// MemberState is a member's health as this node sees it.
type MemberState string

// Member states.
const (
	MemberAlive   MemberState = "alive"
	MemberSuspect MemberState = "suspect"
	MemberDead    MemberState = "dead"
	MemberLeft    MemberState = "left"
)

// member says whether the state is still a member's: a suspect has missed
// probes, which is no proof that it is gone, so fleet-wide operations still
// ask it and accept its requests.
func (s MemberState) member() bool { return s == MemberAlive || s == MemberSuspect }

// Member is one fleet member as this node sees it. Dead and left members
// are listed for a while (Tuning.DeadRetention) without inventory.
type Member struct {
	Name string
	// Addr is the member's gossip address (ip:port).
	Addr   string
	State  MemberState
	Role   Role
	Labels map[string]string
	Meta   Meta
	// Inventory is nil until this node has received one, and for dead or
	// left members.
	Inventory        *Inventory
	InventoryVersion uint64
	// LastUpdate is when the member produced that inventory (its clock).
	LastUpdate time.Time
	Self       bool
}

// Config configures a Node.
type Config struct {
	// NodeName must be unique in the fleet and stable across restarts.
	NodeName string
	// BindAddr is the ip:port for gossip over UDP and TCP (default
	// 0.0.0.0:7946). Ignored when Transport is set.
	BindAddr string
	// AdvertiseAddr is the ip:port other members should use, when it
	// differs from BindAddr (NAT, 0.0.0.0).
	AdvertiseAddr string
	// Join lists host:port of members to join; retried while alone.
	Join []string
	// Keyring holds the cluster keys (LoadKeyFile); the first encrypts.
	// Required unless Insecure.
	Keyring [][]byte
	// KeyFile, when set, is rewritten (mode 0600, key in use first) after
	// every keyring change made through FleetKeys, so that a restart keeps
	// the rotated keys. It is normally the --cluster-key-file.
	KeyFile string
	// Insecure runs gossip without encryption or authentication. Dev only.
	Insecure bool
	// Labels are this node's labels, published with its inventory unless
	// SetLocalInventory is given other labels.
	Labels map[string]string
	Role   Role // default RoleNode
	Meta   Meta
	// Desired is the desired state to share; nil for a member that keeps
	// none (a router).
	Desired *desired.State
	Logger  *slog.Logger
	// Now is the wall clock used for inventory versions; time.Now if nil.
	Now    func() time.Time
	Tuning Tuning
	// Transport replaces the UDP/TCP transport (tests: memberlist.MockNetwork).
	Transport memberlist.Transport
	// Registerer receives the node's metrics; none if nil.
	Registerer prometheus.Registerer
}

// Node is this process's membership in the fleet.
type Node struct {
	cfg     Config
	tun     Tuning
	log     *slog.Logger
	now     func() time.Time
	ml      *memberlist.Memberlist
	keyring *memberlist.Keyring
	desired *desired.State
	queue   *memberlist.TransmitLimitedQueue
	tr      *countingTransport
	met     *nodeMetrics
	meta    []byte
	changed chan struct{}
	jobs    chan job
	stop    chan struct{}
	wg      sync.WaitGroup
	closed  atomic.Bool
	alive   atomic.Int64
	joining atomic.Bool // a rejoin is under way
	keyMu   sync.Mutex  // serialises keyring changes and the key file
	keyOps  keyOps

	mu          sync.Mutex
	peers       map[string]*peer
	self        invRecord
	lastVersion uint64
	sentVersion uint64 // last self version broadcast
	sentAt      time.Time
	wants       map[string]wantMark
	recent      map[string]recentChange // inventory versions to advertise in digests
	digestFor   map[string]uint64       // the entries digestMsg encodes
	digestMsg   []byte

	// Benchmark instrumentation, set before the node gets traffic.
	// onInventory sees every remote inventory record this node accepts;
	// onRumor every rumor copy of one, news or not; onBroadcastRoom the room
	// memberlist leaves for our broadcasts in each gossip packet while ours
	// are queued (its own messages go first).
	onInventory     func(node string, version uint64)
	onRumor         func(node string, version uint64)
	onBroadcastRoom func(room int)
}

type peer struct {
	state     MemberState // alive (joined), dead or left
	addr      string
	ip        net.IP
	port      uint16
	role      Role
	meta      Meta
	rec       *invRecord // complete record held; never mutated once stored
	announced uint64     // highest version seen announced
	departed  time.Time
	leaving   bool // said goodbye: its departure is a leave, not a death
	// pinned is the peer key pinned to the member's name (see pinKey);
	// keyConflict marks the last metadata as announcing another.
	pinned      []byte
	keyConflict bool
}

// ErrInsecure is returned by keyring operations on a node that runs
// without encryption.
var ErrInsecure = errors.New("gossip runs without a keyring (insecure mode)")

// Start joins (or founds) the fleet. It returns once the local member runs;
// when no join address answers, it keeps retrying in the background.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := desired.ValidateNodeName(cfg.NodeName); err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	if cfg.Role == "" {
		cfg.Role = RoleNode
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for k, v := range cfg.Labels {
		if err := (Inventory{Labels: map[string]string{k: v}}).Validate(); err != nil {
			return nil, fmt.Errorf("gossip: %w", err)
		}
	}
	meta, err := encodeMeta(cfg.Role, cfg.Meta)
	if err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	n := &Node{
		cfg:     cfg,
		tun:     cfg.Tuning.withDefaults(),
		log:     cfg.Logger,
		now:     cfg.Now,
		desired: cfg.Desired,
		meta:    meta,
		changed: make(chan struct{}, 1),
		jobs:    make(chan job, 1024),
		stop:    make(chan struct{}),
		peers:   map[string]*peer{},
		wants:   map[string]wantMark{},
		recent:  map[string]recentChange{},
		keyOps:  keyOps{pending: map[string]chan keyAckMsg{}},
	}
	n.met = newNodeMetrics(n)
	n.queue = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return int(max(n.alive.Load(), 1)) },
		RetransmitMult: n.tun.BroadcastRetransmitMult,
	}

	mlc := memberlist.DefaultLANConfig()
	mlc.Name = cfg.NodeName
	switch {
	case cfg.Insecure && len(cfg.Keyring) > 0:
		return nil, errors.New("gossip: a cluster key and insecure mode are exclusive")
	case !cfg.Insecure && len(cfg.Keyring) == 0:
		return nil, errors.New("gossip: a cluster key is required (--cluster-key-file, written by `warmfleet keygen`); --insecure-gossip turns encryption off for development only")
	case !cfg.Insecure:
		for i, k := range cfg.Keyring {
			if len(k) != KeySize {
				return nil, fmt.Errorf("gossip: cluster key %d is %d bytes, want %d", i+1, len(k), KeySize)
			}
		}
		kr, err := memberlist.NewKeyring(cfg.Keyring, cfg.Keyring[0])
		if err != nil {
			return nil, fmt.Errorf("gossip: keyring: %w", err)
		}
		n.keyring = kr
		mlc.Keyring = kr
		mlc.GossipVerifyIncoming, mlc.GossipVerifyOutgoing = true, true
	}

	inner := cfg.Transport
	if inner == nil {
		if cfg.BindAddr == "" {
			cfg.BindAddr = "0.0.0.0:7946"
		}
		ip, port, err := splitIPPort(cfg.BindAddr)
		if err != nil {
			return nil, fmt.Errorf("gossip: bind address: %w", err)
		}
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{ip}, BindPort: port, Logger: newMemberlistLogger(cfg.Logger, &n.closed),
		})
		if err != nil {
			return nil, fmt.Errorf("gossip: listen on %s: %w", cfg.BindAddr, err)
		}
		inner = nt
		mlc.BindAddr, mlc.BindPort = ip, nt.GetAutoBindPort()
		mlc.AdvertisePort = mlc.BindPort
	}
	if cfg.AdvertiseAddr != "" {
		ip, port, err := splitIPPort(cfg.AdvertiseAddr)
		if err != nil {
			_ = inner.Shutdown()
			return nil, fmt.Errorf("gossip: advertise address: %w", err)
		}
		mlc.AdvertiseAddr, mlc.AdvertisePort = ip, port
	}
	n.tr = newCountingTransport(inner)
	mlc.Transport = n.tr
	mlc.Delegate = (*delegate)(n)
	mlc.Events = (*events)(n)
	mlc.Logger = newMemberlistLogger(cfg.Logger, &n.closed)
	mlc.GossipInterval = n.tun.GossipInterval
	mlc.GossipNodes = n.tun.GossipNodes
	mlc.RetransmitMult = n.tun.RetransmitMult
	mlc.ProbeInterval = n.tun.ProbeInterval
	mlc.ProbeTimeout = n.tun.ProbeTimeout
	mlc.SuspicionMult = n.tun.SuspicionMult
	mlc.PushPullInterval = n.tun.PushPullInterval
	mlc.TCPTimeout = n.tun.TCPTimeout
	mlc.UDPBufferSize = n.tun.UDPBufferSize
	// A node restarted on a new address may take its name back soon.
	mlc.DeadNodeReclaimTime = 30 * time.Second

	n.mu.Lock()
	n.self = invRecord{Node: cfg.NodeName, Version: n.nextVersionLocked(), Updated: n.now().UnixMilli(),
		Inv: &Inventory{Labels: maps.Clone(cfg.Labels)}}
	n.mu.Unlock()

	ml, err := memberlist.Create(mlc)
	if err != nil {
		_ = n.tr.Shutdown()
		return nil, fmt.Errorf("gossip: start memberlist: %w", err)
	}
	n.ml = ml
	if n.desired != nil {
		n.desired.SetOnLocal(n.queueSpec)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(n.met); err != nil {
			_ = ml.Shutdown()
			_ = n.tr.Shutdown()
			return nil, fmt.Errorf("gossip: register metrics: %w", err)
		}
	}
	n.wg.Add(3)
	go n.worker()
	go n.worker()
	go n.housekeeping()
	if len(cfg.Join) > 0 {
		if _, err := n.Join(ctx, cfg.Join); err != nil {
			n.log.Warn("gossip: join failed; retrying in the background", "join", cfg.Join, "err", err)
		}
	}
	return n, nil
}

func splitIPPort(s string) (string, int, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	if net.ParseIP(host) == nil {
		return "", 0, fmt.Errorf("%q: want an IP address, not a name", host)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q: want 0-65535", p)
	}
	return host, port, nil
}

// Join contacts the given members (host:port) and merges state with them.
// It returns how many answered.
func (n *Node) Join(ctx context.Context, addrs []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c, err := n.ml.Join(addrs)
	if err != nil {
		return c, fmt.Errorf("gossip: join %s: %w", strings.Join(addrs, ","), err)
	}
	return c, nil
}

// Close leaves the fleet gracefully (others drop this node at once instead
// of suspecting it) and stops. ctx bounds the wait for the leave broadcast.
func (n *Node) Close(ctx context.Context) error {
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	if n.desired != nil {
		n.desired.SetOnLocal(nil)
	}
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	// Say goodbye in the same gossip rounds as memberlist's leave message,
	// so the others record a leave rather than a failure.
	if bye, err := encodeMsg(msgBye, byeMsg{Node: n.cfg.NodeName}); err == nil {
		n.queue.QueueBroadcast(&broadcast{name: "b/" + n.cfg.NodeName, msg: bye})
	}
	errLeave := n.ml.Leave(timeout)
	errShut := n.ml.Shutdown()
	close(n.stop)
	n.wg.Wait()
	if n.cfg.Registerer != nil {
		n.cfg.Registerer.Unregister(n.met)
	}
	if err := errors.Join(errLeave, errShut); err != nil {
		return fmt.Errorf("gossip: close: %w", err)
	}
	return nil
}

// OnChange returns the channel that receives a value after membership or a
// remote inventory changed. Capacity one, coalescing: one consumer drains it
// and calls Members.
func (n *Node) OnChange() <-chan struct{} { return n.changed }

func (n *Node) notifyChange() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// LocalName returns this node's name.
func (n *Node) LocalName() string { return n.cfg.NodeName }

// InstallKey adds a key to this node's keyring; it decrypts with it from
// now on. Rotation without downtime: install the new key on every node, then
// UseKey on every node, then RemoveKey of the old one on every node.
func (n *Node) InstallKey(key []byte) error {
	if n.keyring == nil {
		return ErrInsecure
	}
	if len(key) != KeySize {
		return fmt.Errorf("gossip: key is %d bytes, want %d", len(key), KeySize)
	}
	return n.keyring.AddKey(key)
}

// UseKey makes an installed key the one this node encrypts with.
func (n *Node) UseKey(key []byte) error {
	if n.keyring == nil {
		return ErrInsecure
	}
	return n.keyring.UseKey(key)
}

// RemoveKey removes a key that is not the one in use.
func (n *Node) RemoveKey(key []byte) error {
	if n.keyring == nil {
		return ErrInsecure
	}
	return n.keyring.RemoveKey(key)
}

// Keys returns the installed keys, the one in use first.
func (n *Node) Keys() [][]byte {
	if n.keyring == nil {
		return nil
	}
	primary := n.keyring.GetPrimaryKey()
	out := [][]byte{bytes.Clone(primary)}
	for _, k := range n.keyring.GetKeys() {
		if !bytes.Equal(k, primary) {
			out = append(out, bytes.Clone(k))
		}
	}
	return out
}

// PeerKey returns the p2p identity key pinned to the name of a member
// (alive or suspect), or nil: for the swarm to accept that member's
// handshakes under that name only.
func (n *Node) PeerKey(name string) []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.peers[name]
	if p == nil || !p.state.member() {
		return nil
	}
	return bytes.Clone(p.pinned)
}

// Members returns every member, this node included, sorted by name.
//
// The view is built from memberlist's join and leave events, copied under
// memberlist's lock: the nodes memberlist.Members returns are mutated by
// memberlist after it returns them, so reading them races. memberlist v0.7
// does not report suspicion either (its Node.State is never set), so a
// suspect member is listed alive until declared dead.
func (n *Node) Members() []Member {
	now := n.now()
	n.mu.Lock()
	out := make([]Member, 0, len(n.peers))
	for name, p := range n.peers {
		m := Member{Name: name, Addr: p.addr, State: p.state, Role: p.role, Meta: p.meta, Self: name == n.cfg.NodeName}
		switch {
		case p.state == MemberAlive:
			rec := p.rec
			if m.Self {
				rec = &n.self
			}
			if rec != nil && rec.Inv != nil {
				inv := rec.Inv.Clone()
				m.Inventory, m.InventoryVersion, m.LastUpdate = &inv, rec.Version, time.UnixMilli(rec.Updated)
				m.Labels = maps.Clone(inv.Labels)
			}
		case now.Sub(p.departed) > n.tun.DeadRetention:
			delete(n.peers, name)
			continue
		}
		out = append(out, m)
	}
	n.mu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// inventoryLag reports the largest gap between an announced and a held
// inventory version among live members, and how many are behind.
func (n *Node) inventoryLag() (time.Duration, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var worst time.Duration
	behind := 0
	for _, p := range n.peers {
		if p.state != MemberAlive {
			continue
		}
		var have uint64
		if p.rec != nil {
			have = p.rec.Version
		}
		if p.announced > have {
			behind++
			if have == 0 {
				continue
			}
			worst = max(worst, time.Duration((p.announced>>16)-(have>>16))*time.Millisecond)
		}
	}
	return worst, behind
}

// housekeeping flushes deferred progress and rejoins when alone.
func (n *Node) housekeeping() {
	defer n.wg.Done()
	flush := time.NewTicker(n.tun.ProgressInterval)
	defer flush.Stop()
	rejoin := time.NewTicker(n.tun.RejoinInterval)
	defer rejoin.Stop()
	var digestC <-chan time.Time
	if n.tun.DigestInterval > 0 {
		digest := time.NewTicker(n.tun.DigestInterval)
		defer digest.Stop()
		digestC = digest.C
	}
	for {
		select {
		case <-n.stop:
			return
		case <-digestC:
			n.sendDigest()
		case <-flush.C:
			n.mu.Lock()
			if n.self.Version > n.sentVersion {
				n.broadcastSelfLocked(nil)
			}
			n.mu.Unlock()
		case <-rejoin.C:
			targets := rejoinTargets(n.cfg.Join, n.alive.Load() <= 1, n.deadPeers(), maxRejoinDead)
			if len(targets) == 0 || !n.joining.CompareAndSwap(false, true) {
				continue
			}
			// Off this loop: a join to members that are really gone waits
			// out TCPTimeout per address, and flushes and digests must not.
			n.wg.Go(func() {
				defer n.joining.Store(false)
				n.rejoin(targets)
			})
		}
	}
}

// rejoin tries the targets one at a time until one answers. memberlist's
// Join takes no context and dials every address in turn, each up to
// TCPTimeout: given them all at once, a Close would wait for every dial
// to a member that is really gone.
func (n *Node) rejoin(targets []string) {
	for _, t := range targets {
		if n.closed.Load() {
			return
		}
		if _, err := n.ml.Join([]string{t}); err != nil {
			n.log.Debug("gossip: rejoin", "join", t, "err", err)
			continue
		}
		n.log.Info("gossip: rejoined", "join", t)
		return
	}
}

// maxRejoinDead bounds the dead members one rejoin tries, so a fleet that
// lost many members for good does not spend each round on timeouts.
const maxRejoinDead = 2

// deadMember is a member that died without a goodbye, for rejoinTargets.
type deadMember struct {
	addr     string
	departed time.Time
}

// deadPeers lists the members that died without saying goodbye.
func (n *Node) deadPeers() []deadMember {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []deadMember
	for _, p := range n.peers {
		if p.state == MemberDead && !p.leaving && p.addr != "" {
			out = append(out, deadMember{p.addr, p.departed})
		}
	}
	return out
}

// rejoinTargets says where a rejoin goes: the most recently gone of the
// members that died without a goodbye (up to maxDead), and the join list
// too while this node is alone. memberlist never probes a dead member
// again, so without the dead members the two halves of a healed network
// partition, neither of them alone, would stay apart for good. Nothing
// while the fleet is whole.
func rejoinTargets(join []string, alone bool, dead []deadMember, maxDead int) []string {
	slices.SortFunc(dead, func(a, b deadMember) int { return b.departed.Compare(a.departed) })
	var out []string
	for _, d := range dead[:min(len(dead), maxDead)] {
		out = append(out, d.addr)
	}
	if alone {
		for _, j := range join {
			if !slices.Contains(out, j) {
				out = append(out, j)
			}
		}
	}
	return out
}
