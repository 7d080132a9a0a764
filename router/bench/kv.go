package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/warmfleet/warmfleet/router/kvevents"
	"github.com/warmfleet/warmfleet/router/llmsim"
	"github.com/warmfleet/warmfleet/router/oai"
)

// kvFeed carries one simulator's KV events to the router replicas over a
// real ZMQ PUB socket (the simulator binds, as vLLM does; each replica
// connects) and keeps the virtual clock still while a batch is on its way:
// each batch counts as motion until every replica has applied it, so the
// routers see an engine's cache as promptly at any machine speed as the
// simulated instant allows, and runs stay reproducible.
type kvFeed struct {
	pub   *kvevents.Publisher
	clock llmsim.Clock
	url   string     // the backend's URL in the routers (set once serving)
	f     *fleet     // whose routers must apply each batch
	mu    sync.Mutex // orders the count with the publisher's sequence
	sent  atomic.Uint64
	wake  chan struct{}
	done  chan struct{}
	late  atomic.Uint64 // waits for the replicas that ran out (see run)
}

// lateAfter is how long a batch may take to reach every replica before the
// run goes on without it: far above a loaded machine's delivery time, so
// only a lost batch reaches it.
const lateAfter = 10 * time.Second

func newKVFeed(ctx context.Context, clock llmsim.Clock) (*kvFeed, error) {
	k := &kvFeed{pub: &kvevents.Publisher{Endpoint: "tcp://127.0.0.1:0", Listen: true, Topic: "kv@bench", Queue: 1 << 16},
		clock: clock, wake: make(chan struct{}, 1), done: make(chan struct{})}
	if err := k.pub.Start(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// endpoint is the kv_events address the routers connect to.
func (k *kvFeed) endpoint() string { return "tcp://" + k.pub.Addr() }

// Publish implements llmsim.EventSink. It runs under the simulator's lock:
// it only counts, queues and wakes.
func (k *kvFeed) Publish(evs []kvevents.Event) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.clock.Busy(1)
	err := k.pub.Publish(evs)
	k.sent.Add(1)
	select {
	case k.wake <- struct{}{}:
	default:
	}
	return err
}

// applied is the sequence number every replica has applied up to.
func (k *kvFeed) applied() uint64 {
	low := uint64(1<<64 - 1)
	for _, r := range k.f.routers {
		low = min(low, r.rt.KVStats(k.url).Seq)
	}
	return low
}

// handshake repeats AllBlocksCleared (true of a fresh simulator) until
// every replica follows the stream and trusts it: a PUB drops what it
// sends before a subscriber's connection is up.
func (k *kvFeed) handshake(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		all := true
		for _, r := range k.f.routers {
			all = all && r.rt.KVStats(k.url).Trusted
		}
		if all {
			// Clears still on their way would land among the run's
			// batches and wipe what the engine then holds: wait for
			// every one sent.
			for target := k.sent.Load(); k.applied() < target; {
				if time.Now().After(deadline) || ctx.Err() != nil {
					return fmt.Errorf("bench: the routers never applied %s's handshake", k.url)
				}
				time.Sleep(time.Millisecond)
			}
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("bench: the routers never followed %s's KV events", k.url)
		}
		k.mu.Lock()
		err := k.pub.Publish([]kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
		k.sent.Add(1)
		k.mu.Unlock()
		if err != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// run releases each batch's motion once every replica has applied it (or
// after lateAfter, should a batch be lost: the run then goes on, counted in
// late, and the routers' gap detection does the rest).
func (k *kvFeed) run(ctx context.Context) {
	defer close(k.done)
	var released uint64
	base := k.sent.Load() // the handshake's batches were never counted as motion
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
		}
		for {
			target := k.sent.Load()
			if target == released+base {
				break
			}
			deadline := time.Now().Add(lateAfter)
			for k.applied() < target && ctx.Err() == nil {
				if time.Now().After(deadline) {
					k.late.Add(1)
					break
				}
				time.Sleep(20 * time.Microsecond)
			}
			for ; released+base < target; released++ {
				k.clock.Idle()
			}
		}
	}
}

// tokenWorkload turns every request into a completion whose prompt is
// token ids: the text the simulator would see (chat rendered through its
// template) cut into tokens of charsPerToken bytes, each id a hash of its
// bytes. Shared text stays shared ids, so the workload keeps its reuse,
// and the router can compute the engines' block hashes exactly.
func tokenWorkload(w Workload, charsPerToken int) (Workload, error) {
	out := Workload{Name: w.Name, Requests: make([]Request, len(w.Requests))}
	for i, r := range w.Requests {
		req, err := oai.Scan(r.Body)
		if err != nil {
			return out, fmt.Errorf("bench: %s request %d: %w", w.Name, i, err)
		}
		text := llmsim.Render(&req)
		ids := make([]uint32, 0, len(text)/charsPerToken+1)
		for j := 0; j < len(text); j += charsPerToken {
			ids = append(ids, uint32(xxhash.Sum64(text[j:min(j+charsPerToken, len(text))])>>33))
		}
		body, err := json.Marshal(map[string]any{"model": req.Model, "prompt": ids, "max_tokens": r.OutTokens, "stream": true})
		if err != nil {
			return out, err
		}
		r.Path, r.Body, r.PromptTokens = "/v1/completions", body, max(len(ids), 1)
		out.Requests[i] = r
	}
	return out, nil
}

// promptBlocks is what the engine caches of one request: its block hashes
// and prompt length in tokens, as the simulator computes them.
func promptBlocks(req *oai.Request, tok llmsim.Tokenizer, seed string) ([]uint64, int) {
	if ids, ok := oai.TokenIDs(req.Prompt, nil); ok && !req.HasMessages && req.CacheSalt == "" {
		return kvevents.LLMDChain(seed, req.Model, ids, tok.BlockTokens), max(len(ids), 1)
	}
	text := llmsim.Render(req)
	return tok.BlockHashes(text, req.CacheSalt), max(tok.Tokens(text), 1)
}
