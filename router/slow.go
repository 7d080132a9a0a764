package router

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// A request body is slow once it has been read for slowBodyAfter and, in
// the last slowBodyAfter, fewer than slowBodyBytes of it arrived: one that
// trickles in (a slowloris) takes one of the Config.MaxSlowBodies slots. A
// body that a client sends at once is read well within slowBodyAfter, and
// one that keeps arriving at a fair rate is looked at again a period later
// rather than counted: the clock alone would also count a large upload,
// and a reader that the machine's load kept from reading bytes that had
// long arrived.
const (
	slowBodyAfter = time.Second
	slowBodyBytes = 8 << 10
)

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
	// got is how many bytes the reader has had so far; seen, what it had
	// at the last look (the alarm's).
	got  atomic.Int64
	seen int64
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
	w.w, w.limit, w.state, w.seen = rw, limit, bodyReading, 0
	w.got.Store(0)
	w.armLocked(slowBodyAfter)
	return w
}

// read records n more bytes of the body.
func (w *bodyWatch) read(n int) { w.got.Add(int64(n)) }

// slow runs each time the body has been read for another slowBodyAfter:
// it looks again a period later while the body keeps arriving.
func (w *bodyWatch) slow() {
	got := w.got.Load()
	fresh := got - w.seen
	w.seen = got
	if fresh >= slowBodyBytes {
		w.armLocked(slowBodyAfter)
		return
	}
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

// readFull is io.ReadFull(r, buf), telling w of every read.
func (w *bodyWatch) readFull(r io.Reader, buf []byte) error {
	for n := 0; n < len(buf); {
		m, err := r.Read(buf[n:])
		n += m
		w.read(m)
		if err != nil {
			if n == len(buf) {
				return nil
			}
			if err == io.EOF && n > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// countedReader tells a bodyWatch of every read.
type countedReader struct {
	r io.Reader
	w *bodyWatch
}

func (c countedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.w.read(n)
	return n, err
}
