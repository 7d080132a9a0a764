package gossip

import "time"

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
	// RejoinInterval: while no other member is alive, retry the join list;
	// while members are dead without a goodbye, try them and the join list.
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
