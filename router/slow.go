package router

import (
	"net/http"
	"sync"
	"time"
)

// slowBodyAfter is when a request body still arriving counts as slow. A
// body that a client sends at once is read well within it; one that
// trickles in (a slowloris) takes one of the Config.MaxSlowBodies slots.
const slowBodyAfter = time.Second

// slowBodies counts the request bodies being read past slowBodyAfter.
type slowBodies struct {
	mu sync.Mutex
	n  int
}

func (s *slowBodies) take(limit int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n >= limit {
		return false
	}
	s.n++
	return true
}

func (s *slowBodies) release() {
	s.mu.Lock()
	s.n--
	s.mu.Unlock()
}

// Slow reports how many request bodies are being read past slowBodyAfter.
func (rt *Router) Slow() int {
	rt.slowBodies.mu.Lock()
	defer rt.slowBodies.mu.Unlock()
	return rt.slowBodies.n
}

// bodyWatch follows one body read: once slowBodyAfter has passed it holds
// a slot, or, with none free, cuts the read short through its deadline.
type bodyWatch struct {
	s     *slowBodies
	t     *time.Timer
	mu    sync.Mutex
	state int
}

const (
	bodyReading = iota
	bodySlow    // holds a slot
	bodyRefused // no slot: the read was cut short
	bodyDone
)

func (s *slowBodies) watch(rc *http.ResponseController, limit int) *bodyWatch {
	w := &bodyWatch{s: s}
	w.t = time.AfterFunc(slowBodyAfter, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.state != bodyReading {
			return
		}
		if s.take(limit) {
			w.state = bodySlow
			return
		}
		w.state = bodyRefused
		_ = rc.SetReadDeadline(time.Now()) // the read in progress fails at once
	})
	return w
}

// done ends the watch and reports whether the read was cut short for want
// of a slot.
func (w *bodyWatch) done() (refused bool) {
	w.t.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state {
	case bodySlow:
		w.s.release()
	case bodyRefused:
		refused = true
	}
	w.state = bodyDone
	return refused
}
