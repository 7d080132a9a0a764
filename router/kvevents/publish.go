package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// EncodeBatch encodes events as vLLM's KVEventBatch: the msgspec
// array_like form [ts, [event...], nil] with array-encoded events, or with
// mapEvents the named-field map events of vLLM's newer format. Token ids
// are not carried (the subscriber skips them anyway) and the medium is
// always "GPU".
func EncodeBatch(ts float64, events []Event, mapEvents bool) ([]byte, error) {
	evs := make([]any, 0, len(events))
	for _, ev := range events {
		var parent any
		if ev.HasParent {
			parent = ev.Parent
		}
		hashes := ev.Hashes
		if hashes == nil {
			hashes = []uint64{}
		}
		switch {
		case ev.Kind == BlockStored && mapEvents:
			evs = append(evs, map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
				"token_ids": []uint32{}, "block_size": ev.BlockSize, "lora_id": nil, "medium": "GPU"})
		case ev.Kind == BlockStored:
			evs = append(evs, []any{"BlockStored", hashes, parent, []uint32{}, ev.BlockSize, nil, "GPU"})
		case ev.Kind == BlockRemoved && mapEvents:
			evs = append(evs, map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"})
		case ev.Kind == BlockRemoved:
			evs = append(evs, []any{"BlockRemoved", hashes, "GPU"})
		case ev.Kind == AllBlocksCleared && mapEvents:
			evs = append(evs, map[string]any{"type": "AllBlocksCleared"})
		case ev.Kind == AllBlocksCleared:
			evs = append(evs, []any{"AllBlocksCleared"})
		default:
			return nil, fmt.Errorf("kv events: cannot encode %v", ev.Kind)
		}
	}
	b, err := msgpack.Marshal([]any{ts, evs, nil})
	if err != nil {
		return nil, fmt.Errorf("kv events: encode: %w", err)
	}
	return b, nil
}

// Publisher sends KV events as vLLM's ZmqEventPublisher does: a ZMQ PUB
// socket, three frames per batch (topic, sequence number as 8 bytes
// big-endian counting from 1, msgpack payload). Publish never blocks: a
// batch that finds the queue full is dropped and its sequence number
// skipped, so subscribers see the loss as a gap instead of missing it.
type Publisher struct {
	Endpoint  string // tcp://HOST:PORT
	Listen    bool   // bind Endpoint (vLLM's default); otherwise connect to it (llm-d's simulator)
	Topic     string
	MapEvents bool
	Queue     int            // batches queued before dropping; 1024 if zero
	Now       func() float64 // the batch's timestamp (seconds); 0 when nil

	// mu orders sequence numbers and the queue alike: a batch numbered
	// before another is queued before it.
	mu      sync.Mutex
	queue   chan []byte
	seq     uint64
	dropped atomic.Uint64
	sock    zmq4.Socket
	done    chan struct{}
}

// Start opens the socket; the publisher sends until ctx ends.
func (p *Publisher) Start(ctx context.Context) error {
	hostport, err := ParseEndpoint(p.Endpoint)
	if err != nil {
		return err
	}
	n := p.Queue
	if n <= 0 {
		n = 1024
	}
	p.queue = make(chan []byte, n)
	p.done = make(chan struct{})
	p.sock = zmq4.NewPub(ctx)
	if p.Listen {
		err = p.sock.Listen("tcp://" + hostport)
	} else {
		err = p.sock.Dial("tcp://" + hostport)
	}
	if err != nil {
		_ = p.sock.Close()
		return fmt.Errorf("kv events publisher %s: %w", p.Endpoint, err)
	}
	go p.run(ctx)
	return nil
}

// Addr is the bound address in Listen mode.
func (p *Publisher) Addr() string {
	if a := p.sock.Addr(); a != nil {
		return a.String()
	}
	return ""
}

// Wait returns once the publisher stopped (its ctx ended).
func (p *Publisher) Wait() { <-p.done }

// Dropped is how many batches a full queue dropped.
func (p *Publisher) Dropped() uint64 { return p.dropped.Load() }

func (p *Publisher) run(ctx context.Context) {
	defer close(p.done)
	defer p.sock.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case frame := <-p.queue:
			// A PUB socket drops what no subscriber takes; an error here
			// is a closed socket, and the stream is over.
			seq, payload := frame[:8], frame[8:]
			if err := p.sock.Send(zmq4.NewMsgFrom([]byte(p.Topic), seq, payload)); err != nil && ctx.Err() != nil {
				return
			}
		}
	}
}

// Publish queues one batch of events (an engine step's).
func (p *Publisher) Publish(events []Event) error {
	ts := 0.0
	if p.Now != nil {
		ts = p.Now()
	}
	payload, err := EncodeBatch(ts, events, p.MapEvents)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	frame := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(payload)), p.seq)
	select {
	case p.queue <- append(frame, payload...):
	default:
		p.dropped.Add(1)
	}
	return nil
}
