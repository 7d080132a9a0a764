package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Subscriber follows one backend's event stream into an Index.
type Subscriber struct {
	Backend string // the backend's name in the Index (its URL in the router)
	// Endpoint is tcp://HOST:PORT. By default the subscriber connects to it,
	// as to vLLM's publisher bound to tcp://*:PORT. With Listen the
	// subscriber binds it and the engine connects, as llm-d's simulator
	// (and vLLM given a non-wildcard endpoint) does.
	Endpoint string
	Listen   bool
	// Topic, when set, is the topic this backend's engine publishes under
	// (llm-d's engines use kv@POD_IP@MODEL): messages under any other
	// topic, say from another engine pointed at the same address, are
	// counted as foreign and not applied. Empty accepts every topic.
	Topic  string
	Index  *Index
	Limits Limits
	Log    *slog.Logger // nil: discard
	// OnApply, if set, is called after each batch is applied, outside the
	// Index's lock, with the backend's stats then: a caller that corrects
	// its own view from the stream (a reset, the learned capacity) hooks in
	// here. It runs on the subscriber's goroutine: do not block.
	OnApply func(Stats)
	// MinBackoff and MaxBackoff bound the wait between connection attempts
	// (doubling from min to max); After is the clock's timer (time.After
	// when nil).
	MinBackoff, MaxBackoff time.Duration
	After                  func(time.Duration) <-chan time.Time

	counters Counters
	once     sync.Map // problem kinds already logged
	addr     atomic.Value
}

// Counters count frames that were refused, by cause.
type Counters struct {
	Frames, Malformed, BadFrames, Foreign, Disconnects atomic.Uint64
}

// Counters returns the subscriber's counters.
func (s *Subscriber) Counters() *Counters { return &s.counters }

// Addr is the bound address in Listen mode, once bound ("" before).
func (s *Subscriber) Addr() string {
	a, _ := s.addr.Load().(string)
	return a
}

// ParseEndpoint checks a tcp://HOST:PORT event address.
func ParseEndpoint(ep string) (hostport string, err error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("kv events endpoint %q: want tcp://HOST:PORT", ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || port == "" {
		return "", fmt.Errorf("kv events endpoint %q: want tcp://HOST:PORT", ep)
	}
	return net.JoinHostPort(host, port), nil
}

// logOnce logs the first problem of each kind, so a flood of garbage is
// counted but does not flood the log.
func (s *Subscriber) logOnce(kind string, err error) {
	if _, dup := s.once.LoadOrStore(kind, true); dup {
		return
	}
	s.Log.Warn("kv events: "+kind+" (further ones only counted)", "backend", s.Backend, "endpoint", s.Endpoint, "err", err)
}

// Run follows the stream until ctx ends, reconnecting with backoff; it
// returns nil when ctx ends, or an error for a bad configuration.
func (s *Subscriber) Run(ctx context.Context) error {
	hostport, err := ParseEndpoint(s.Endpoint)
	if err != nil {
		return err
	}
	if s.Limits == (Limits{}) {
		s.Limits = DefaultLimits()
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	if s.After == nil {
		s.After = time.After
	}
	if s.MinBackoff <= 0 {
		s.MinBackoff = 100 * time.Millisecond
	}
	if s.MaxBackoff < s.MinBackoff {
		s.MaxBackoff = max(s.MinBackoff, 5*time.Second)
	}
	if err := registerBounded(s.Limits.MaxFrame); err != nil {
		return fmt.Errorf("kv events: %w", err)
	}
	defer s.Index.Disconnected(s.Backend)
	ep := boundedScheme + "://" + hostport
	backoff := s.MinBackoff
	for ctx.Err() == nil {
		received, err := s.session(ctx, ep)
		if ctx.Err() != nil {
			return nil
		}
		s.Index.Disconnected(s.Backend)
		s.counters.Disconnects.Add(1)
		// A failed bind is retried too: the port may still be taken
		// just after a restart of the router.
		s.logOnce("stream lost", err)
		if received {
			backoff = s.MinBackoff
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.After(backoff):
		}
		backoff = min(2*backoff, s.MaxBackoff)
	}
	return nil
}

// session runs one socket until its stream fails; received tells whether
// any valid batch arrived (to reset the backoff).
func (s *Subscriber) session(ctx context.Context, ep string) (received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithAutomaticReconnect(false))
	defer sock.Close()
	if err := sock.SetOption(zmq4.OptionSubscribe, s.Topic); err != nil {
		return false, fmt.Errorf("subscribe: %w", err)
	}
	if s.Listen {
		if err := sock.Listen(ep); err != nil {
			return false, fmt.Errorf("listen %s: %w", s.Endpoint, err)
		}
		if a := sock.Addr(); a != nil {
			s.addr.Store(a.String())
		}
	} else if err := sock.Dial(ep); err != nil {
		return false, fmt.Errorf("dial %s: %w", s.Endpoint, err)
	}
	for {
		msg, err := sock.Recv()
		if err != nil {
			if s.Listen && ctx.Err() == nil {
				// The engine's connection dropped; the socket keeps
				// listening for its return.
				s.Index.Disconnected(s.Backend)
				s.counters.Disconnects.Add(1)
				s.logOnce("publisher connection lost", err)
				continue
			}
			return received, fmt.Errorf("receive: %w", err)
		}
		if s.handle(msg.Frames) {
			received = true
		}
	}
}

// handle applies one multipart message [topic, seq, payload]; it reports
// whether the message was a valid batch.
func (s *Subscriber) handle(frames [][]byte) bool {
	s.counters.Frames.Add(1)
	if s.Topic != "" && len(frames) > 0 && string(frames[0]) != s.Topic {
		// A ZMQ subscription matches topic prefixes; this one is exact.
		s.counters.Foreign.Add(1)
		s.logOnce("message under a foreign topic", fmt.Errorf("topic %q, want %q", frames[0], s.Topic))
		return false
	}
	seq, b, err := ParseMessage(frames, s.Limits)
	if err != nil {
		if errors.Is(err, ErrMalformed) {
			s.counters.Malformed.Add(1)
			s.logOnce("malformed batch", err)
		} else {
			s.counters.BadFrames.Add(1)
			s.logOnce("bad message framing", err)
		}
		return false
	}
	s.Index.Apply(s.Backend, seq, b)
	if s.OnApply != nil {
		s.OnApply(s.Index.Stats(s.Backend))
	}
	return true
}

// ParseMessage splits a published message into its sequence number and
// decoded batch. vLLM's ZmqEventPublisher sends three frames: the topic
// (free text, "kv@POD@MODEL" for llm-d), the sequence number as 8 bytes
// big-endian, and the msgpack payload.
func ParseMessage(frames [][]byte, lim Limits) (seq uint64, b Batch, err error) {
	if len(frames) != 3 {
		return 0, Batch{}, fmt.Errorf("kv events: message of %d frames, want 3 (topic, seq, payload)", len(frames))
	}
	if len(frames[0]) > lim.MaxTopicBytes {
		return 0, Batch{}, fmt.Errorf("kv events: topic of %d bytes", len(frames[0]))
	}
	if len(frames[1]) != 8 {
		return 0, Batch{}, fmt.Errorf("kv events: sequence frame of %d bytes, want 8", len(frames[1]))
	}
	seq = binary.BigEndian.Uint64(frames[1])
	b, err = DecodeBatch(frames[2], lim)
	if err != nil {
		return 0, Batch{}, err
	}
	return seq, b, nil
}
