package kvevents

import (
	"cmp"
	"slices"
	"sync"
)

// ChainCache remembers the llm-d block hashes of runs of blocks it has
// computed, so the blocks that many prompts share (a document, a system
// prompt, a chat's history) are hashed with FNV once rather than at every
// request. FNV-64a is a multiply per byte, each depending on the last, so
// a prompt of a few thousand tokens costs tens of microseconds however it
// is encoded; a remembered run costs a quick hash of its token ids (a
// multiply per two tokens), a table slot and a comparison of memory laid
// out in a row. Runs of about runTokens tokens, rather than single blocks,
// keep a prompt's table reads few and sequential.
//
// The cache is exact: a run is used only when its first block's parent
// hash and its token ids equal the prompt's, so its answer is the one
// AppendLLMDChain would give. A prompt's last, shorter run is hashed each
// time. The table is fixed, sized by tokens so that its memory does not
// grow with the block size, and two-way: a new run takes the slot, of its
// two, found or stored the longer ago, so the runs requests share are not
// pushed out by runs seen once. Safe for concurrent use.
type ChainCache struct {
	mu        sync.Mutex
	maxTokens int // 0: chainCacheTokens
	blockSize int
	run       int // blocks per run
	bits      uint
	slots     []chainSlot
	toks      []uint32 // slot i's tokens at [i*run*blockSize, (i+1)*run*blockSize)
	hashes    []uint64 // slot i's block hashes at [i*run, (i+1)*run)
	clock     uint64
}

type chainSlot struct {
	parent, sum uint64
	last        uint64 // ChainCache.clock when last stored or found
	used        bool
}

const (
	// chainCacheTokens bounds the token ids a ChainCache keeps (4 bytes
	// each, and 2 bytes of hashes more per token at block size 16).
	chainCacheTokens = 1 << 20
	// runTokens is about how many tokens one entry holds.
	runTokens = 256
)

// AppendLLMDChain is AppendLLMDChain through the cache.
func (c *ChainCache) AppendLLMDChain(dst []uint64, seed, model string, tokens []uint32, blockSize, maxBlocks int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	if n := len(tokens) / blockSize; maxBlocks <= 0 || maxBlocks > n {
		maxBlocks = n
	}
	parent := llmdRoot(seed, model)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setBlockSize(blockSize)
	i, runToks := 0, c.run*blockSize
	for ; i+c.run <= maxBlocks; i += c.run {
		toks := tokens[i*blockSize : i*blockSize+runToks]
		sum := blockSum(parent, toks)
		at := len(dst)
		if slot, ok := c.lookup(parent, sum, toks); ok {
			dst = append(dst, c.hashes[slot*c.run:(slot+1)*c.run]...)
		} else {
			dst = appendLLMDBlocks(dst, parent, toks, blockSize, c.run)
			c.store(parent, sum, toks, dst[at:])
		}
		parent = dst[len(dst)-1]
	}
	return appendLLMDBlocks(dst, parent, tokens[i*blockSize:], blockSize, maxBlocks-i)
}

// setBlockSize (re)makes the table for blockSize, under c.mu.
func (c *ChainCache) setBlockSize(blockSize int) {
	if c.blockSize == blockSize {
		return
	}
	c.blockSize, c.run = blockSize, max(1, runTokens/blockSize)
	runToks := c.run * blockSize
	c.bits = 0
	for 2<<(c.bits+1)*runToks <= cmp.Or(c.maxTokens, chainCacheTokens) {
		c.bits++
	}
	c.slots = make([]chainSlot, 2<<c.bits)
	c.toks = make([]uint32, (2<<c.bits)*runToks)
	c.hashes = make([]uint64, (2<<c.bits)*c.run)
}

// blockSum is a quick hash of a run and its parent, to pick its slots and
// to turn most mismatches away before the tokens are compared. Four lanes,
// so the multiplies overlap.
func blockSum(parent uint64, toks []uint32) uint64 {
	const m = 0x9e3779b97f4a7c15
	a, b, c, d := parent*m, uint64(len(toks)), uint64(0), uint64(0)
	i := 0
	for ; i+8 <= len(toks); i += 8 {
		a = (a ^ (uint64(toks[i]) | uint64(toks[i+1])<<32)) * m
		b = (b ^ (uint64(toks[i+2]) | uint64(toks[i+3])<<32)) * m
		c = (c ^ (uint64(toks[i+4]) | uint64(toks[i+5])<<32)) * m
		d = (d ^ (uint64(toks[i+6]) | uint64(toks[i+7])<<32)) * m
	}
	for ; i < len(toks); i++ {
		a = (a ^ uint64(toks[i])) * m
	}
	h := (a ^ b<<17 ^ b>>47 ^ c<<31 ^ c>>33 ^ d<<47 ^ d>>17) * m
	return h ^ h>>31
}

// set is the first of the two slots a run may take (from the top bits,
// where the multiplies leave the most mixing).
func (c *ChainCache) set(sum uint64) int { return int((sum*0xff51afd7ed558ccd)>>(64-c.bits)) * 2 }

func (c *ChainCache) lookup(parent, sum uint64, toks []uint32) (int, bool) {
	n := len(toks)
	for i := c.set(sum); i < c.set(sum)+2; i++ {
		if s := &c.slots[i]; s.used && s.sum == sum && s.parent == parent && slices.Equal(c.toks[i*n:(i+1)*n], toks) {
			c.clock++
			s.last = c.clock
			return i, true
		}
	}
	return 0, false
}

// store puts a run in the slot of its two used the longer ago, so a run
// that requests keep finding survives a stream of runs seen once.
func (c *ChainCache) store(parent, sum uint64, toks []uint32, hashes []uint64) {
	i := c.set(sum)
	if c.slots[i+1].last < c.slots[i].last {
		i++
	}
	c.clock++
	c.slots[i] = chainSlot{parent: parent, sum: sum, last: c.clock, used: true}
	copy(c.toks[i*len(toks):], toks)
	copy(c.hashes[i*c.run:], hashes)
}
