package router

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestPeersShareOneView: a replica that observes another's events routes a
// prefix group the other placed to the same backend, as a hit, although
// it never saw the group itself.
func TestPeersShareOneView(t *testing.T) {
	var urls []string
	for i := range 4 {
		urls = append(urls, okBackend(t, fmt.Sprint("b", i), nil).URL)
	}
	b := newHarness(t, Defaults(), Options{}, urls...)
	var mu sync.Mutex
	var kinds []EventKind
	a := newHarness(t, Defaults(), Options{OnEvent: func(e Event) {
		mu.Lock()
		kinds = append(kinds, e.Kind)
		mu.Unlock()
		b.rt.Observe("a", e)
	}}, urls...)
	doc := func(d, q int) string {
		text := strings.Repeat(fmt.Sprintf("document %d says something long. ", d), 100)
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q},{"role":"user","content":"question %d"}]}`, text, q)
	}
	placed := map[int]string{}
	for d := range 12 {
		resp := post(t, a.srv.URL+"/v1/chat/completions", doc(d, 0))
		resp.Body.Close()
		placed[d] = resp.Header.Get("X-Backend")
	}
	a.settle()
	for d := range 12 {
		resp := post(t, b.srv.URL+"/v1/chat/completions", doc(d, 1), DebugRequestHeader, "1")
		resp.Body.Close()
		route := resp.Header.Get(RouteHeader)
		if got := resp.Header.Get("X-Backend"); got != placed[d] || !strings.Contains(route, "reason=hit") {
			t.Errorf("doc %d: replica b sent it to %s (%s); replica a had placed it on %s", d, got, route, placed[d])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// Each request: placed, prefilled (first byte), released.
	if want := 36; len(kinds) != want || kinds[0] != Placed || kinds[1] != Prefilled || kinds[2] != Released {
		t.Errorf("events %v, want %d in placed/prefilled/released order", kinds, want)
	}
}

// TestObservePeerLoad: what a peer sends counts in a backend's load until
// it ends; a count never goes below what that peer added; a Load snapshot
// replaces the running count; ForgetPeer drops it all.
func TestObservePeerLoad(t *testing.T) {
	h := newHarness(t, Defaults(), Options{}, okBackend(t, "b0", nil).URL, okBackend(t, "b1", nil).URL)
	id := firstID(h.rt)
	peerLoadOf := func() (int, int) {
		st := h.rt.Snapshot().Backends[0]
		return st.PeerInflight, st.PeerPending
	}
	steps := []struct {
		name           string
		do             func()
		inflight, pend int
	}{
		{"x placed", func() { h.rt.Observe("x", Event{Kind: Placed, Backend: id, Blocks: 5}) }, 1, 5},
		{"y placed", func() { h.rt.Observe("y", Event{Kind: Placed, Backend: id, Blocks: 2}) }, 2, 7},
		{"x prefilled", func() { h.rt.Observe("x", Event{Kind: Prefilled, Backend: id, Blocks: 5}) }, 2, 2},
		{"x released", func() { h.rt.Observe("x", Event{Kind: Released, Backend: id}) }, 1, 2},
		{"x released twice", func() { h.rt.Observe("x", Event{Kind: Released, Backend: id}) }, 1, 2},
		{"x prefilled more than it sent", func() { h.rt.Observe("x", Event{Kind: Prefilled, Backend: id, Blocks: 50}) }, 1, 2},
		{"unknown backend", func() { h.rt.Observe("x", Event{Kind: Placed, Backend: id + 1, Blocks: 9}) }, 1, 2},
		{"unknown kind", func() { h.rt.Observe("x", Event{Kind: 99, Backend: id, Blocks: 9}) }, 1, 2},
		{"x load snapshot", func() { h.rt.Observe("x", Event{Kind: Load, Backend: id, Inflight: 3, Blocks: 30, Prefilling: 2}) }, 4, 32},
		{"negative snapshot", func() { h.rt.Observe("x", Event{Kind: Load, Backend: id, Inflight: -3, Blocks: -1}) }, 1, 2},
		{"forget y", func() { h.rt.ForgetPeer("y") }, 0, 0},
	}
	for _, s := range steps {
		s.do()
		if in, p := peerLoadOf(); in != s.inflight || p != s.pend {
			t.Fatalf("%s: peer inflight %d, pending %d; want %d, %d", s.name, in, p, s.inflight, s.pend)
		}
	}
	// A peer's load is load: the bound sees it. Both backends idle here but
	// for 40 requests a peer has on backend 0, so a new request goes to 1.
	for range 40 {
		h.rt.Observe("z", Event{Kind: Placed, Backend: id, Blocks: 1})
	}
	resp := post(t, h.srv.URL+"/v1/completions", `{"model":"m","prompt":"hello"}`)
	resp.Body.Close()
	if got := resp.Header.Get("X-Backend"); got != "b1" {
		t.Fatalf("request went to %s, the backend a peer has 40 requests on", got)
	}
}

// TestLoadEvents: a replica's snapshot is its own load, not what peers
// told it (or peers would echo each other's load back and forth).
func TestLoadEvents(t *testing.T) {
	h := newHarness(t, Defaults(), Options{}, okBackend(t, "b0", nil).URL)
	id := firstID(h.rt)
	h.rt.Observe("x", Event{Kind: Placed, Backend: id, Blocks: 5})
	h.rt.mu.Lock()
	h.rt.order[0].inflight, h.rt.order[0].pending, h.rt.order[0].prefilling = 2, 9, 1
	h.rt.mu.Unlock()
	got := h.rt.LoadEvents()
	want := Event{Kind: Load, Backend: id, Inflight: 2, Blocks: 9, Prefilling: 1}
	if len(got) != 1 || got[0].Kind != want.Kind || got[0].Backend != want.Backend || got[0].Inflight != 2 || got[0].Blocks != 9 || got[0].Prefilling != 1 {
		t.Fatalf("LoadEvents = %+v, want [%+v]", got, want)
	}
}

// firstID is the first backend's id, read under the lock the router's
// endpoint sync writes it under.
func firstID(rt *Router) uint64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.order[0].id
}
