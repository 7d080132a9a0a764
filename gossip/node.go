package gossip

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
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

// Tuning holds the protocol timings. Zero fields take the defaults, which
// aim at about a second of convergence for a few hundred nodes.
type Tuning struct {
	// GossipInterval and GossipNodes: every interval, pending broadcasts go
	// to that many random members.
	GossipInterval time.Duration // default 100ms
	GossipNodes    int           // default 4
	// RetransmitMult: each of memberlist's own broadcasts (alive, suspect,
	// dead) is sent RetransmitMult*ceil(log10(N+1)) times by every node that
	// passes it on.
	RetransmitMult int // default 3
	// BroadcastRetransmitMult is the same for this package's broadcasts
	// (inventory, specs). Every copy goes to one random member, so a member
	// misses all ~M*ceil(log10(N+1))*N copies with probability about
	// e^-(M*ceil(log10(N+1))): at 256 members and M=3 that is 1.2e-4 per
	// member, one change in thirty leaving someone to wait for push/pull
	// (8s at that size); M=5 makes it 3e-7 per member.
	BroadcastRetransmitMult int // default 5
	ProbeInterval           time.Duration
	ProbeTimeout            time.Duration
	SuspicionMult           int
	// PushPullInterval is the anti-entropy period for small fleets;
	// memberlist stretches it with log2 of the fleet size above 32 members.
	PushPullInterval time.Duration // default 2s
	// TCPTimeout bounds stream dials and reads (push/pull, fetches).
	TCPTimeout time.Duration // default 5s
	// ProgressInterval is the longest a progress-only inventory change (byte
	// counts, free space) waits before it is broadcast.
	ProgressInterval time.Duration // default 2s
	// DigestInterval: while this node holds inventory changes younger than
	// DigestWindow (and older than DigestDelay), it sends their versions to
	// one random member every interval; a member that missed the rumor pulls
	// the record from it (see digest.go). Off (zero) by default: in the
	// 256-member in-process benchmark it did not shorten the tail and at
	// 100-250ms it tipped the fleet into a suspicion storm; see digest.go.
	DigestInterval time.Duration // default 0: no digests
	DigestDelay    time.Duration // default 5*GossipInterval
	DigestWindow   time.Duration // default DigestDelay+3*DigestInterval
	// RejoinInterval: while no other member is alive, retry the join list.
	RejoinInterval time.Duration // default 5s
	// DeadRetention: how long dead and left members stay in Members.
	DeadRetention time.Duration // default 10m
	// UDPBufferSize is the largest packet; MaxBroadcastBytes the largest
	// message of ours that rides one (bigger ones are fetched over a stream).
	UDPBufferSize     int // default 1400
	MaxBroadcastBytes int // default UDPBufferSize-200
}

func (t Tuning) withDefaults() Tuning {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&t.GossipInterval, 100*time.Millisecond)
	defInt(&t.GossipNodes, 4)
	defInt(&t.RetransmitMult, 3)
	defInt(&t.BroadcastRetransmitMult, 5)
	def(&t.ProbeInterval, time.Second)
	def(&t.ProbeTimeout, 500*time.Millisecond)
	defInt(&t.SuspicionMult, 4)
	def(&t.PushPullInterval, 2*time.Second)
	def(&t.TCPTimeout, 5*time.Second)
	def(&t.ProgressInterval, 2*time.Second)
	def(&t.DigestDelay, 5*t.GossipInterval)
	def(&t.DigestWindow, t.DigestDelay+3*t.DigestInterval)
	def(&t.RejoinInterval, 5*time.Second)
	def(&t.DeadRetention, 10*time.Minute)
	defInt(&t.UDPBufferSize, 1400)
	defInt(&t.MaxBroadcastBytes, t.UDPBufferSize-200)
	return t
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
	Desired *DesiredState
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
	desired *DesiredState
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
	keyMu   sync.Mutex // serialises keyring changes and the key file
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
}

type wantMark struct {
	version uint64
	retry   time.Time
}

// job is work for the stream workers, off memberlist's receive paths.
type job struct {
	to   string   // member to send to
	want []string // ask `to` for these members' inventories
	give []string // send `to` our copies of these members' inventories
	// packet: ask and answer in packets (the answer falls back to a stream
	// when it does not fit one). Digest pulls use it: they fetch records
	// that were broadcast whole, so they fit.
	packet bool
	send   []byte // a message to send `to` reliably
}

// ErrInsecure is returned by keyring operations on a node that runs
// without encryption.
var ErrInsecure = errors.New("gossip runs without a keyring (insecure mode)")

// Start joins (or founds) the fleet. It returns once the local member runs;
// when no join address answers, it keeps retrying in the background.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := validateNodeName(cfg.NodeName); err != nil {
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
		n.desired.setOnLocal(n.queueSpec)
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
		n.desired.setOnLocal(nil)
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

// nextVersionLocked returns a version above every earlier one: wall
// milliseconds shifted left 16 bits, so versions stay ordered across restarts
// (a restarted node must not restart at 1 while others hold its old record)
// and the version lag metric can be read in time.
func (n *Node) nextVersionLocked() uint64 {
	v := uint64(n.now().UnixMilli()) << 16
	if v <= n.lastVersion {
		v = n.lastVersion + 1
	}
	n.lastVersion = v
	return v
}

// SetLocalInventory publishes this node's inventory. Changes in what is held
// or its state are broadcast at once; changes in byte counts and free space
// only wait for the next progress flush (Tuning.ProgressInterval).
func (n *Node) SetLocalInventory(inv Inventory) error {
	if err := inv.Validate(); err != nil {
		return fmt.Errorf("gossip: inventory: %w", err)
	}
	inv = inv.Clone()
	if inv.Labels == nil {
		inv.Labels = maps.Clone(n.cfg.Labels)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	rec := invRecord{Node: n.cfg.NodeName, Version: n.nextVersionLocked(), Updated: n.now().UnixMilli(), Inv: &inv}
	full, err := encodeMsg(msgInventory, rec)
	if err != nil {
		return err
	}
	if len(full) > maxInventoryBytes {
		return fmt.Errorf("gossip: inventory encodes to %d bytes, at most %d", len(full), maxInventoryBytes)
	}
	prev := n.self.Inv
	n.self = rec
	if prev != nil && progressOnly(*prev, inv) && n.now().Sub(n.sentAt) < n.tun.ProgressInterval {
		return nil
	}
	n.broadcastSelfLocked(full)
	return nil
}

// broadcastSelfLocked queues this node's current record, or only its
// version when the record does not fit a packet.
func (n *Node) broadcastSelfLocked(full []byte) {
	msg := full
	if msg == nil || len(msg) > n.tun.MaxBroadcastBytes {
		var err error
		if msg == nil {
			msg, err = encodeMsg(msgInventory, n.self)
		}
		if err == nil && len(msg) > n.tun.MaxBroadcastBytes {
			msg, err = encodeMsg(msgInventory, invRecord{Node: n.self.Node, Version: n.self.Version, Updated: n.self.Updated})
		}
		if err != nil {
			n.log.Error("gossip: encode own inventory", "err", err)
			return
		}
	}
	n.queue.QueueBroadcast(&broadcast{name: "i/" + n.self.Node, msg: msg})
	n.sentVersion, n.sentAt = n.self.Version, n.now()
	n.noteRecentLocked(n.self.Node, n.self.Version)
}

// queueSpec broadcasts a desired-state record (called under the
// DesiredState lock, in write order).
func (n *Node) queueSpec(r Record) {
	msg, err := encodeMsg(msgSpecs, specsMsg{Records: []Record{r}})
	if err != nil {
		n.log.Error("gossip: encode spec record", "key", r.Key, "err", err)
		return
	}
	if len(msg) > n.tun.MaxBroadcastBytes {
		// Push/pull carries it; specs are bounded well below this in practice.
		n.log.Warn("gossip: spec record too large to broadcast; it spreads by anti-entropy", "key", r.Key, "bytes", len(msg))
		return
	}
	n.queue.QueueBroadcast(&broadcast{name: "s/" + r.Key, msg: msg})
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

// handleMessage processes one message from NotifyMsg. raw may be reused by
// memberlist after return; nothing keeps it without copying.
func (n *Node) handleMessage(raw []byte) {
	t, p, err := decodeFrame(raw, maxStreamPayload)
	if err != nil {
		n.dropped(err)
		return
	}
	if (t == msgSpecs || t == msgInventory || t == msgBye || t == msgDigest) && len(p) > maxPacketPayload {
		n.met.drop(dropOversize)
		return
	}
	n.met.received.WithLabelValues(t.String()).Inc()
	switch t {
	case msgSpecs:
		m, err := decodeSpecs(p)
		if err != nil {
			n.dropped(err)
			return
		}
		if n.desired == nil {
			return
		}
		applied, bad, err := n.desired.merge(context.Background(), m.Records)
		n.met.dropped.WithLabelValues(dropInvalid).Add(float64(bad))
		if err != nil {
			n.log.Error("gossip: save desired state", "err", err)
			return
		}
		for _, r := range applied {
			n.queueSpec(r) // pass it on: broadcasts spread epidemically
		}
	case msgInventory:
		rec, err := decodeInventory(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.applyInventory(rec, bytes.Clone(raw))
	case msgBye:
		b, err := decodeBye(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.applyBye(b.Node, bytes.Clone(raw))
	case msgWant:
		w, err := decodeWant(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.enqueue(job{to: w.From, give: w.Nodes, packet: w.Packet})
	case msgDigest:
		m, err := decodeDigest(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.applyDigest(m)
	case msgInventories:
		m, err := decodeInventories(p)
		if err != nil {
			n.dropped(err)
			return
		}
		for _, r := range m.Records {
			if err := r.validate(); err != nil || r.Inv == nil {
				n.met.drop(dropInvalid)
				continue
			}
			n.applyInventory(r, nil)
		}
	case msgKeyOp:
		m, err := decodeKeyOp(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.handleKeyOp(m)
	case msgKeyAck:
		a, err := decodeKeyAck(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.handleKeyAck(a)
	default:
		n.met.drop(dropUnexpected)
	}
}

func (n *Node) dropped(err error) {
	reason := dropDecode
	switch {
	case errors.Is(err, errOversize):
		reason = dropOversize
	case errors.Is(err, errInvalid):
		reason = dropInvalid
	}
	n.met.drop(reason)
	n.log.Debug("gossip: dropped message", "reason", reason, "err", err)
}

// applyInventory merges a peer's record. forward, when not nil, is the
// broadcast as received, passed on if the record was news.
func (n *Node) applyInventory(rec invRecord, forward []byte) {
	if rec.Node == n.cfg.NodeName {
		return
	}
	n.mu.Lock()
	p := n.peers[rec.Node]
	if p == nil || p.state != MemberAlive {
		// Unknown or departed: its records must not come back through stale
		// gossip. Anti-entropy brings it once memberlist admits the node.
		n.mu.Unlock()
		return
	}
	if n.onRumor != nil && forward != nil {
		n.onRumor(rec.Node, rec.Version)
	}
	p.announced = max(p.announced, rec.Version)
	if p.rec != nil && rec.Version <= p.rec.Version {
		n.mu.Unlock()
		return
	}
	if rec.Inv == nil {
		want := n.markWantLocked(rec.Node, rec.Version)
		n.mu.Unlock()
		if forward != nil {
			n.queue.QueueBroadcast(&broadcast{name: "i/" + rec.Node, msg: forward})
		}
		if want {
			n.enqueue(job{to: rec.Node, want: []string{rec.Node}})
		}
		return
	}
	stored := rec
	p.rec = &stored
	if forward != nil {
		// Only what spread as a rumor is advertised in digests: records
		// fetched or merged by anti-entropy are already that path's job,
		// and a mass join would otherwise turn every push/pull into
		// digests and pulls.
		n.noteRecentLocked(rec.Node, rec.Version)
	}
	hook := n.onInventory
	n.mu.Unlock()
	if forward != nil {
		n.queue.QueueBroadcast(&broadcast{name: "i/" + rec.Node, msg: forward})
	}
	n.notifyChange()
	if hook != nil {
		hook(rec.Node, rec.Version)
	}
}

// applyBye marks a member as leaving (or, if its departure was already
// seen, as left) and passes the news on once.
func (n *Node) applyBye(name string, forward []byte) {
	if name == n.cfg.NodeName {
		return
	}
	n.mu.Lock()
	p := n.peers[name]
	news := p != nil && !p.leaving
	if news {
		p.leaving = true
		if p.state == MemberDead {
			p.state = MemberLeft
		}
	}
	n.mu.Unlock()
	if news {
		n.queue.QueueBroadcast(&broadcast{name: "b/" + name, msg: forward})
		n.notifyChange()
	}
}

// markWantLocked records that we fetch node's inventory at version, unless
// a fetch of it is already under way.
func (n *Node) markWantLocked(node string, version uint64) bool {
	return n.markWantForLocked(node, version, n.tun.TCPTimeout)
}

// markWantForLocked is markWantLocked with the time after which a fetch
// that brought nothing may be retried: short for packets, which get lost.
func (n *Node) markWantForLocked(node string, version uint64, retry time.Duration) bool {
	now := n.now()
	if w, ok := n.wants[node]; ok && w.version >= version && now.Before(w.retry) {
		return false
	}
	n.wants[node] = wantMark{version: version, retry: now.Add(retry)}
	return true
}

func (n *Node) enqueue(j job) {
	select {
	case n.jobs <- j:
	default:
		n.met.drop(dropQueueFull)
	}
}

// worker runs stream sends, which block, off memberlist's receive paths.
func (n *Node) worker() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case j := <-n.jobs:
			n.runJob(j)
		}
	}
}

func (n *Node) runJob(j job) {
	if j.to == n.cfg.NodeName {
		return
	}
	n.mu.Lock()
	p := n.peers[j.to]
	var to *memberlist.Node
	if p != nil && p.state == MemberAlive {
		to = &memberlist.Node{Name: j.to, Addr: p.ip, Port: p.port}
	}
	n.mu.Unlock()
	if to == nil {
		return
	}
	if len(j.want) > 0 {
		msg, err := encodeMsg(msgWant, wantMsg{From: n.cfg.NodeName, Nodes: j.want, Packet: j.packet})
		switch {
		case err == nil && j.packet:
			err = n.ml.SendBestEffort(to, msg)
		case err == nil:
			err = n.ml.SendReliable(to, msg)
		}
		if err != nil {
			n.log.Debug("gossip: ask for inventories", "to", j.to, "err", err)
		}
	}
	if len(j.give) > 0 {
		n.sendInventories(to, j.give, j.packet)
	}
	if len(j.send) > 0 {
		if err := n.ml.SendReliable(to, j.send); err != nil {
			n.log.Debug("gossip: send", "to", j.to, "err", err)
		}
	}
}

// sendInventories sends our copies of the named members' records, in
// messages of bounded size.
func (n *Node) sendInventories(to *memberlist.Node, names []string, packet bool) {
	n.mu.Lock()
	var recs []invRecord
	for _, name := range names {
		if name == n.cfg.NodeName {
			recs = append(recs, n.self)
		} else if p := n.peers[name]; p != nil && p.state == MemberAlive && p.rec != nil {
			recs = append(recs, *p.rec)
		}
	}
	n.mu.Unlock()
	if packet && len(recs) > 0 {
		msg, err := encodeMsg(msgInventories, inventoriesMsg{Records: recs})
		if err == nil && len(msg) <= n.tun.MaxBroadcastBytes {
			if err := n.ml.SendBestEffort(to, msg); err != nil {
				n.log.Debug("gossip: send inventories", "to", to.Name, "err", err)
			}
			return
		}
	}
	const batch = 64
	for len(recs) > 0 {
		k := min(batch, len(recs))
		msg, err := encodeMsg(msgInventories, inventoriesMsg{Records: recs[:k]})
		recs = recs[k:]
		if err == nil {
			err = n.ml.SendReliable(to, msg)
		}
		if err != nil {
			n.log.Debug("gossip: send inventories", "to", to.Name, "err", err)
			return
		}
	}
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
			if len(n.cfg.Join) > 0 && n.alive.Load() <= 1 {
				if _, err := n.ml.Join(n.cfg.Join); err != nil {
					n.log.Debug("gossip: rejoin", "join", n.cfg.Join, "err", err)
				} else {
					n.log.Info("gossip: rejoined", "join", n.cfg.Join)
				}
			}
		}
	}
}

// localState builds this node's push/pull state.
func (n *Node) localState() []byte {
	st := stateMsg{From: n.cfg.NodeName}
	if n.desired != nil {
		fs, err := n.desired.snapshot(context.Background())
		if err != nil {
			n.log.Error("gossip: desired state snapshot", "err", err)
		} else {
			st.Desired, st.Records, st.Stale, st.Synced = true, fs.Records, fs.Stale, fs.Synced
		}
	}
	n.mu.Lock()
	self := n.self
	st.Self = &self
	st.Digest = make(map[string]uint64, len(n.peers)+1)
	st.Digest[n.cfg.NodeName] = self.Version
	for name, p := range n.peers {
		if p.state == MemberAlive && p.rec != nil {
			st.Digest[name] = p.rec.Version
		}
	}
	n.mu.Unlock()
	b, err := encodeMsg(msgState, st)
	if err != nil {
		n.log.Error("gossip: encode state", "err", err)
		return nil
	}
	return b
}

// mergeState merges a peer's push/pull state and asks it for what we lack.
func (n *Node) mergeState(buf []byte) {
	t, p, err := decodeFrame(buf, maxStreamPayload)
	if err == nil && t != msgState {
		err = fmt.Errorf("%w: push/pull carried a %s message", errInvalid, t)
	}
	var st stateMsg
	if err == nil {
		st, err = decodeState(p)
	}
	if err != nil {
		n.dropped(err)
		return
	}
	n.met.received.WithLabelValues(msgState.String()).Inc()
	if n.desired != nil && st.Desired {
		_, bad, err := n.desired.mergeFull(context.Background(), fullState{Records: st.Records, Stale: st.Stale, Synced: st.Synced})
		n.met.dropped.WithLabelValues(dropInvalid).Add(float64(bad))
		if err != nil {
			n.log.Error("gossip: save desired state", "err", err)
		}
	}
	if st.Self != nil {
		n.applyInventory(*st.Self, nil)
	}
	var want []string
	n.mu.Lock()
	for name, v := range st.Digest {
		p := n.peers[name]
		if name == n.cfg.NodeName || name == st.From || p == nil || p.state != MemberAlive {
			continue
		}
		p.announced = max(p.announced, v)
		if (p.rec == nil || v > p.rec.Version) && n.markWantLocked(name, v) {
			want = append(want, name)
		}
	}
	n.mu.Unlock()
	if len(want) > 0 {
		slices.Sort(want)
		n.enqueue(job{to: st.From, want: want})
	}
}

// delegate and events adapt Node to memberlist's callback interfaces
// without exporting the callbacks on Node.
type (
	delegate Node
	events   Node
)

func (d *delegate) NodeMeta(limit int) []byte {
	if len(d.meta) > limit {
		return nil
	}
	return d.meta
}
func (d *delegate) NotifyMsg(b []byte) { (*Node)(d).handleMessage(b) }
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	if d.onBroadcastRoom != nil && d.queue.NumQueued() > 0 {
		d.onBroadcastRoom(limit)
	}
	return d.queue.GetBroadcasts(overhead, limit)
}
func (d *delegate) LocalState(bool) []byte              { return (*Node)(d).localState() }
func (d *delegate) MergeRemoteState(buf []byte, _ bool) { (*Node)(d).mergeState(buf) }

// Event callbacks run under memberlist's node lock: they must not call back
// into memberlist, and they hand stream work to the workers.
func (e *events) NotifyJoin(mn *memberlist.Node) {
	n := (*Node)(e)
	n.alive.Add(1)
	n.mu.Lock()
	p := n.peers[mn.Name]
	if p == nil {
		p = &peer{}
		n.peers[mn.Name] = p
	}
	rejoined := p.state == MemberDead || p.state == MemberLeft
	p.state, p.departed, p.leaving = MemberAlive, time.Time{}, false
	p.setAddr(mn)
	n.setMetaLocked(p, mn)
	n.mu.Unlock()
	n.log.Debug("gossip: member joined", "member", mn.Name, "rejoined", rejoined)
	if rejoined && mn.Name != n.cfg.NodeName {
		n.enqueue(job{to: mn.Name, want: []string{mn.Name}})
	}
	n.notifyChange()
}

func (e *events) NotifyLeave(mn *memberlist.Node) {
	n := (*Node)(e)
	n.alive.Add(-1)
	n.mu.Lock()
	p := n.peers[mn.Name]
	if p == nil {
		p = &peer{}
		n.peers[mn.Name] = p
	}
	// memberlist does not tell a leave from a death (Node.State is never
	// set); a leaving node says goodbye first.
	p.state = MemberDead
	if p.leaving {
		p.state = MemberLeft
	}
	p.rec, p.announced, p.departed = nil, 0, n.now()
	p.setAddr(mn)
	delete(n.wants, mn.Name)
	state := p.state
	n.mu.Unlock()
	// A member that said goodbye left on purpose (a restart, a stop of the
	// fleet) and this node's own leave is no news: only a death is worth
	// an operator's line.
	level := slog.LevelInfo
	if state == MemberLeft || mn.Name == n.cfg.NodeName {
		level = slog.LevelDebug
	}
	n.log.Log(context.Background(), level, "gossip: member gone", "member", mn.Name, "state", state)
	n.notifyChange()
}

func (e *events) NotifyUpdate(mn *memberlist.Node) {
	n := (*Node)(e)
	n.mu.Lock()
	if p := n.peers[mn.Name]; p != nil {
		p.setAddr(mn)
		n.setMetaLocked(p, mn)
	}
	n.mu.Unlock()
	n.notifyChange()
}

func (p *peer) setAddr(mn *memberlist.Node) {
	p.ip, p.port = slices.Clone(mn.Addr), mn.Port
	p.addr = net.JoinHostPort(p.ip.String(), strconv.Itoa(int(p.port)))
}

func (n *Node) setMetaLocked(p *peer, mn *memberlist.Node) {
	role, meta, err := decodeMeta(mn.Meta)
	if err != nil {
		// Keep the member (memberlist admitted it) but never target it.
		n.met.drop(dropInvalid)
		n.log.Warn("gossip: member has unreadable metadata", "member", mn.Name, "err", err)
		p.role, p.meta = "", Meta{}
		return
	}
	p.role, p.meta = role, meta
}

// broadcast is one queued message; a newer one with the same name replaces
// it in the queue.
type broadcast struct {
	name string
	msg  []byte
}

func (b *broadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*broadcast)
	return ok && ob.name == b.name
}
func (b *broadcast) Name() string    { return b.name }
func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Finished()       {}

// memberlistLogger routes memberlist's log lines to slog by their prefix.
// Once the node is closing (closed) every line is debug: memberlist's own
// goroutines race its Shutdown and outlive it (a probe in flight runs to
// its timeout), and what they report then (a send on the socket just
// closed, a peer that "answered over TCP but not UDP") is part of the
// stop, not a fault.
type memberlistLogger struct {
	log    *slog.Logger
	closed *atomic.Bool
}

func newMemberlistLogger(l *slog.Logger, closed *atomic.Bool) *log.Logger {
	return log.New(memberlistLogger{l, closed}, "", 0)
}

func (w memberlistLogger) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for prefix, l := range map[string]slog.Level{"[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelWarn, "[ERROR]": slog.LevelWarn} {
		if rest, ok := strings.CutPrefix(msg, prefix); ok {
			msg, level = strings.TrimSpace(rest), l
			break
		}
	}
	if w.closed.Load() {
		level = slog.LevelDebug
	}
	w.log.Log(context.Background(), level, msg)
	return len(p), nil
}
