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

	watches sync.Pool // *bodyWatch
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
// Watches are pooled, each with its own alarm.
type bodyWatch struct {
	alarm
	s     *slowBodies
	w     http.ResponseWriter // its controller is made only to cut a read short
	limit int
	state int // written by the alarm's expire, read after disarm
}

const (
	bodyReading = iota
	bodySlow    // holds a slot
	bodyRefused // no slot: the read was cut short
)

func (s *slowBodies) watch(rw http.ResponseWriter, limit int) *bodyWatch {
	w, ok := s.watches.Get().(*bodyWatch)
	if !ok {
		w = &bodyWatch{s: s}
		w.init(w.slow)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.w, w.limit, w.state = rw, limit, bodyReading
	w.armLocked(slowBodyAfter)
	return w
}

// slow runs once the body has been read for slowBodyAfter.
func (w *bodyWatch) slow() {
	if w.s.take(w.limit) {
		w.state = bodySlow
		return
	}
	w.state = bodyRefused
	_ = http.NewResponseController(w.w).SetReadDeadline(time.Now()) // the read in progress fails at once
}

// done ends the watch and reports whether the read was cut short for want
// of a slot.
func (w *bodyWatch) done() (refused bool) {
	w.disarm()
	switch w.state {
	case bodySlow:
		w.s.release()
	case bodyRefused:
		refused = true
	}
	w.w = nil
	w.s.watches.Put(w)
	return refused
}
