package router

import "slices"

// Several router replicas in front of one fleet each see only their own
// traffic: a prefix one replica placed looks cold to the others, and each
// counts a backend's load as only what it sent itself. Replicas that tell
// each other what they do (Events, delivered by whatever connects them)
// and Observe what they hear route from one view of the fleet.

// EventKind is what happened to a request.
type EventKind uint8

// The events of one request, in order. Prefilled may be missing (a request
// that failed before its first byte is Released only).
const (
	// Placed: the request was sent to Backend, which now holds Keys and has
	// Blocks more prompt blocks to prefill.
	Placed EventKind = iota + 1
	// Prefilled: its first byte came back; its Blocks are no longer pending.
	Prefilled
	// Released: it ended.
	Released
	// Load: not a request but the sender's whole load on Backend, which
	// replaces what its events added up to (they can be lost when a link
	// breaks, or cross a snapshot). Replicas send one per backend now and
	// then.
	Load
)

// Event is one request's change, or a replica's load on one backend, as a
// peer replica needs to know it. Backend is the id rendezvous hashing
// uses, which replicas share.
type Event struct {
	Kind    EventKind
	Backend uint64
	// Blocks is the request's uncached prompt blocks (Placed, Prefilled),
	// or the prompt blocks pending prefill (Load).
	Blocks int
	Keys   []uint64 // the prompt's chained block hashes, first block first (Placed)
	// Inflight and Prefilling are the sender's requests in flight on
	// Backend, and those not answered yet (Load).
	Inflight, Prefilling int
}

// peerLoad is requests peer replicas sent to one backend.
type peerLoad struct{ inflight, pending, prefilling int }

func (l *peerLoad) add(d peerLoad) {
	l.inflight += d.inflight
	l.pending += d.pending
	l.prefilling += d.prefilling
}

// emit hands an event to OnEvent; Placed keys are copied, since the
// request's buffer goes back to a pool when it ends.
func (rt *Router) emit(e Event) {
	if rt.opts.OnEvent == nil {
		return
	}
	e.Keys = slices.Clone(e.Keys)
	rt.opts.OnEvent(e)
}

// Observe applies an event from peer replica `peer` as if this router had
// seen the request itself: a placement teaches the index and counts in the
// traffic shares, and the request counts in the backend's load until it is
// released. An event for a backend this router does not know is dropped;
// a count never goes below what the peer has added, so a lost or repeated
// event cannot leave a backend looking busier or idler for good.
func (rt *Router) Observe(peer string, e Event) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var b *backend
	for _, o := range rt.order {
		if o.id == e.Backend {
			b = o
			break
		}
	}
	if b == nil {
		return
	}
	if b.peerLoads == nil {
		b.peerLoads = map[string]*peerLoad{}
	}
	pl := b.peerLoads[peer]
	if pl == nil {
		pl = &peerLoad{}
		b.peerLoads[peer] = pl
	}
	blocks := max(e.Blocks, 0)
	var d peerLoad
	switch e.Kind {
	case Placed:
		rt.countLocked(b)
		if len(e.Keys) > 0 {
			rt.index.Insert(b.slot, e.Keys, 0)
		}
		d = peerLoad{inflight: 1, pending: blocks, prefilling: 1}
	case Prefilled:
		d = peerLoad{pending: -min(blocks, pl.pending), prefilling: -min(1, pl.prefilling)}
	case Released:
		d = peerLoad{inflight: -min(1, pl.inflight)}
	case Load:
		d = peerLoad{inflight: max(e.Inflight, 0) - pl.inflight, pending: blocks - pl.pending,
			prefilling: max(e.Prefilling, 0) - pl.prefilling}
	default:
		return
	}
	pl.add(d)
	b.peers.add(d)
	if d.inflight < 0 || d.prefilling < 0 {
		rt.wakeLocked()
	}
}

// LoadEvents returns a Load event for every backend: what this router
// has in flight there now, for peers to replace their running count with.
func (rt *Router) LoadEvents() []Event {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := make([]Event, 0, len(rt.order))
	for _, b := range rt.order {
		out = append(out, Event{Kind: Load, Backend: b.id, Blocks: b.pending, Inflight: b.inflight, Prefilling: b.prefilling})
	}
	return out
}

// ForgetPeer drops the load a peer replica had counted on every backend
// (it went away, or its stream broke and events may have been lost). What
// it taught the index stays: the backends still hold those prefixes.
func (rt *Router) ForgetPeer(peer string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, b := range rt.order {
		if pl := b.peerLoads[peer]; pl != nil {
			b.peers.add(peerLoad{inflight: -pl.inflight, pending: -pl.pending, prefilling: -pl.prefilling})
			delete(b.peerLoads, peer)
		}
	}
	rt.wakeLocked()
}
