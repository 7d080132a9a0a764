package desired

import (
	"cmp"
	"math"
	"sync"
	"time"
)

// Timestamp is a hybrid logical clock reading: wall milliseconds, a logical
// counter for events within one millisecond (or behind a peer's clock), and
// the writing node's name to break the remaining ties deterministically.
type Timestamp struct {
	Wall    int64  `json:"w"`
	Logical uint32 `json:"l,omitempty"`
	Node    string `json:"n"`
}

// Compare orders timestamps: wall, then logical, then node name.
func (t Timestamp) Compare(o Timestamp) int {
	if c := cmp.Compare(t.Wall, o.Wall); c != 0 {
		return c
	}
	if c := cmp.Compare(t.Logical, o.Logical); c != 0 {
		return c
	}
	return cmp.Compare(t.Node, o.Node)
}

// Time returns the wall part as a time.
func (t Timestamp) Time() time.Time { return time.UnixMilli(t.Wall) }

// hlc issues timestamps that never go backwards, even when the wall clock
// does, and that follow timestamps observed from peers.
type hlc struct {
	mu       sync.Mutex
	now      func() time.Time
	node     string
	maxDrift time.Duration
	wall     int64
	logical  uint32
}

func newHLC(node string, now func() time.Time, maxDrift time.Duration) *hlc {
	return &hlc{now: now, node: node, maxDrift: maxDrift}
}

// next returns a timestamp later than every earlier reading and than floor.
func (c *hlc) next(floor Timestamp) Timestamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	pt := c.now().UnixMilli()
	wall := max(pt, c.wall, floor.Wall)
	var logical uint64
	if wall == c.wall {
		logical = uint64(c.logical) + 1
	}
	if wall == floor.Wall {
		logical = max(logical, uint64(floor.Logical)+1)
	}
	if logical > math.MaxUint32 {
		// The counter is full (a peer can send any value): the next
		// millisecond is later still, and maxWall leaves room for it.
		wall, logical = wall+1, 0
	}
	c.wall, c.logical = wall, uint32(logical)
	return Timestamp{Wall: wall, Logical: uint32(logical), Node: c.node}
}

// maxWall bounds the wall part of a timestamp from outside (the end of year
// 9999): next must always be able to issue a later one.
const maxWall = 253402300799999

// observe moves the clock past a timestamp seen from a peer, unless that
// timestamp is further ahead of our wall clock than maxDrift: one node with a
// broken clock must not drag every other clock into the future. It reports
// whether the timestamp was within bounds.
func (c *hlc) observe(t Timestamp) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxDrift > 0 && t.Wall > c.now().Add(c.maxDrift).UnixMilli() {
		return false
	}
	if t.Wall > c.wall || (t.Wall == c.wall && t.Logical > c.logical) {
		c.wall, c.logical = t.Wall, t.Logical
	}
	return true
}
