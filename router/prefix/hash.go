// Package prefix turns a prompt into chained, keyed block hashes and keeps
// an approximate, capacity-bounded index of which backend holds which blocks.
//
// Block i's hash covers every byte before the end of block i (chaining), so
// two prompts share exactly as many leading hashes as they share leading
// blocks. Chat messages are hashed in order with their roles; the model name,
// the caller's cache_salt and a session key are mixed into the first link, so
// tenants that salt their requests never share cache entries.
package prefix

import (
	"strconv"

	"github.com/cespare/xxhash/v2"
	"github.com/warmfleet/warmfleet/router/oai"
)

// Hasher cuts prompts into fixed-size blocks and chains their hashes.
type Hasher struct {
	Key        Key
	BlockChars int // bytes per block; 256 if zero
	MaxBlocks  int // hash at most this many leading blocks; 1024 if zero
}

func (h Hasher) blockChars() int {
	if h.BlockChars > 0 {
		return h.BlockChars
	}
	return 256
}

func (h Hasher) maxBlocks() int {
	if h.MaxBlocks > 0 {
		return h.MaxBlocks
	}
	return 1024
}

// chain feeds byte pieces into fixed-size blocks without copying the bulk.
type chain struct {
	h      Hasher
	size   int
	max    int
	d      xxhash.Digest // a value: a pointer to one on the stack made it escape
	filled int
	prev   uint64
	out    []uint64
}

func (c *chain) write(p []byte) {
	for len(p) > 0 && len(c.out) < c.max {
		if c.filled == 0 && len(p) >= c.size {
			// A whole block in one piece, as most are: one call, no
			// streaming state (the same hash as through the digest).
			c.link(xxhash.Sum64(p[:c.size]))
			p = p[c.size:]
			continue
		}
		n := min(c.size-c.filled, len(p))
		_, _ = c.d.Write(p[:n])
		c.filled += n
		p = p[n:]
		if c.filled == c.size {
			c.emit()
		}
	}
}

func (c *chain) emit() {
	c.link(c.d.Sum64())
	c.d.Reset()
	c.filled = 0
}

// link appends the next chained hash, of the block whose own hash is h.
func (c *chain) link(h uint64) {
	c.prev = c.h.Key.Sum2(c.prev, h)
	c.out = append(c.out, c.prev)
}

// Blocks appends to dst the chained hashes of the request's full blocks and,
// if the tail is partial, one more hash covering it (so short prompts still
// get a routing key). It returns dst and the number of full blocks.
func (h Hasher) Blocks(dst []uint64, model string, req *oai.Request, session string) ([]uint64, int) {
	if dst == nil {
		n := len(req.Prompt)
		for i := range req.Messages {
			n += len(req.Messages[i].Content) + len(req.Messages[i].Role) + 2
		}
		dst = make([]uint64, 0, min(n/h.blockChars()+1, h.maxBlocks()))
	}
	var seed xxhash.Digest
	seed.Reset()
	c := chain{h: h, size: h.blockChars(), max: h.maxBlocks(), out: dst}
	c.d.Reset()
	// Seed link: everything that must separate caches but is not prompt text.
	_, _ = seed.WriteString(model)
	_, _ = seed.WriteString("\x00salt:")
	_, _ = seed.WriteString(req.CacheSalt)
	_, _ = seed.WriteString("\x00session:")
	_, _ = seed.WriteString(session)
	c.prev = h.Key.Sum2(0x5eed, seed.Sum64())
	if req.HasMessages {
		for i := range req.Messages {
			m := &req.Messages[i]
			// Role markers, like a chat template, so moving text between
			// roles changes the hashes.
			c.write([]byte("\x1e"))
			c.write([]byte(m.Role))
			c.write([]byte("\x1f"))
			c.write(m.Content)
		}
	} else {
		c.write(req.Prompt)
	}
	full := len(c.out) - len(dst)
	if c.filled > 0 && len(c.out) < c.max {
		c.emit()
	}
	return c.out, full
}

// BackendID is a stable identity for rendezvous hashing (the backend URL).
func BackendID(url string) uint64 { return xxhash.Sum64String("backend:" + url) }

// String formats a hash for debug output without revealing anything more
// than the keyed hash itself.
func String(h uint64) string { return strconv.FormatUint(h, 16) }
