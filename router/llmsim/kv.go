package llmsim

import (
	"github.com/cespare/xxhash/v2"
	"github.com/warmfleet/warmfleet/router/kvevents"
	"github.com/warmfleet/warmfleet/router/oai"
)

// Tokenizer turns requests into the token stream the simulator "computes":
// chat messages rendered through a fixed template, then CharsPerToken bytes
// per token, cut into blocks of BlockTokens tokens hashed as a chain (vLLM's
// prefix caching: a block is reusable only with everything before it).
type Tokenizer struct {
	CharsPerToken int
	BlockTokens   int
}

// Render returns the prompt text the way a chat template would lay it out.
func Render(req *oai.Request) []byte {
	if !req.HasMessages {
		return req.Prompt
	}
	var out []byte
	for _, m := range req.Messages {
		out = append(out, "<|"...)
		out = append(out, m.Role...)
		out = append(out, "|>"...)
		out = append(out, m.Content...)
		out = append(out, "<|end|>"...)
	}
	return append(out, "<|assistant|>"...)
}

// Tokens is the prompt length in tokens.
func (t Tokenizer) Tokens(text []byte) int {
	return (len(text) + t.CharsPerToken - 1) / t.CharsPerToken
}

// BlockHashes returns the chained hashes of the full blocks of text.
func (t Tokenizer) BlockHashes(text []byte, salt string) []uint64 {
	size := t.CharsPerToken * t.BlockTokens
	n := len(text) / size
	out := make([]uint64, 0, n)
	prev := xxhash.Sum64String("salt:" + salt)
	var buf [8]byte
	for i := range n {
		d := xxhash.New()
		for j := range buf {
			buf[j] = byte(prev >> (8 * j))
		}
		_, _ = d.Write(buf[:])
		_, _ = d.Write(text[i*size : (i+1)*size])
		prev = d.Sum64()
		out = append(out, prev)
	}
	return out
}

// kvCache is a paged KV cache of fixed capacity with prefix caching: blocks
// of running sequences are pinned; finished sequences leave their full
// blocks cached and evictable, least recently freed first, tail blocks
// before head blocks (as vLLM frees them).
type kvCache struct {
	capacity int
	blocks   map[uint64]*kvBlock
	anon     int // pinned blocks without a reusable hash (partial tail, output)
	// evictable list: head is most recently freed.
	head, tail *kvBlock
	evictable  int

	// record: keep the changes as KV events until takeEvents.
	record      bool
	blockTokens int
	events      []kvevents.Event
}

// takeEvents returns the changes recorded since the last call.
func (c *kvCache) takeEvents() []kvevents.Event {
	evs := c.events
	c.events = nil
	return evs
}

// stored records newly cached blocks: hashes[from:] of a chain.
func (c *kvCache) stored(hashes []uint64, from int) {
	if !c.record || from >= len(hashes) {
		return
	}
	ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: append([]uint64(nil), hashes[from:]...), BlockSize: c.blockTokens}
	if from > 0 {
		ev.Parent, ev.HasParent = hashes[from-1], true
	}
	c.events = append(c.events, ev)
}

func (c *kvCache) removed(h uint64) {
	if !c.record {
		return
	}
	if n := len(c.events); n > 0 && c.events[n-1].Kind == kvevents.BlockRemoved {
		c.events[n-1].Hashes = append(c.events[n-1].Hashes, h)
		return
	}
	c.events = append(c.events, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{h}})
}

type kvBlock struct {
	hash       uint64
	refs       int
	prev, next *kvBlock
}

func newKVCache(capacity int) *kvCache {
	return &kvCache{capacity: capacity, blocks: map[uint64]*kvBlock{}}
}

func (c *kvCache) unlink(b *kvBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		c.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next = nil, nil
	c.evictable--
}

func (c *kvCache) pushFront(b *kvBlock) {
	b.prev, b.next = nil, c.head
	if c.head != nil {
		c.head.prev = b
	}
	c.head = b
	if c.tail == nil {
		c.tail = b
	}
	c.evictable++
}

// cachedPrefix is how many leading hashes are in the cache.
func (c *kvCache) cachedPrefix(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := c.blocks[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// free is how many blocks could be handed out now.
func (c *kvCache) free() int {
	return c.capacity - len(c.blocks) - c.anon + c.evictable
}

// need is how many new blocks admitting a sequence takes.
func (c *kvCache) need(hashes []uint64, anon int) int {
	n := anon
	for _, h := range hashes {
		if b, ok := c.blocks[h]; !ok {
			n++
		} else if b.refs == 0 {
			n++ // it is counted free now; pinning it uses one up
		}
	}
	return n
}

// pin allocates a sequence's blocks (caller checked need <= free).
func (c *kvCache) pin(hashes []uint64, anon int) {
	first := len(hashes) // the first block newly stored: the rest of the chain is new too
	for i, h := range hashes {
		b, ok := c.blocks[h]
		if !ok {
			first = min(first, i)
			for len(c.blocks)+c.anon >= c.capacity && c.tail != nil {
				c.evictTail()
			}
			b = &kvBlock{hash: h}
			c.blocks[h] = b
		} else if b.refs == 0 {
			c.unlink(b)
		}
		b.refs++
	}
	for len(c.blocks)+c.anon+anon > c.capacity && c.tail != nil {
		c.evictTail()
	}
	c.anon += anon
	c.stored(hashes, first)
}

func (c *kvCache) evictTail() {
	b := c.tail
	c.unlink(b)
	delete(c.blocks, b.hash)
	c.removed(b.hash)
}

// unpin releases a sequence's blocks; hashed ones stay cached, the tail
// of the prompt becoming evictable first.
func (c *kvCache) unpin(hashes []uint64, anon int) {
	c.anon -= anon
	for i := len(hashes) - 1; i >= 0; i-- {
		b, ok := c.blocks[hashes[i]]
		if !ok {
			continue
		}
		if b.refs--; b.refs == 0 {
			c.pushFront(b)
		}
	}
}

// used is the fraction of blocks pinned by running sequences.
func (c *kvCache) used() float64 {
	return float64(len(c.blocks)-c.evictable+c.anon) / float64(c.capacity)
}
