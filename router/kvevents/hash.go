package kvevents

import (
	"encoding/binary"
	"hash/fnv"
)

// LLMDChain computes the block hashes llm-d's token processor
// (llm-d-kv-cache, pkg/kvcache/kvblock/token_processor.go), and so
// llm-d-inference-sim, gives a token-id prompt without LoRA or multimodal
// inputs: one per full block, each FNV-64a over the canonical CBOR of
// [parent, block tokens, nil], the first parent being FNV-64a of
// [FNV-64a(seed), nil, model]. These are exactly the hashes the simulator
// publishes (its integration test checks it); they are not vLLM's, which
// hashes with sha256 over CBOR from a PYTHONHASHSEED-derived root.
func LLMDChain(seed, model string, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	return AppendLLMDChain(make([]uint64, 0, len(tokens)/blockSize), seed, model, tokens, blockSize, 0)
}

// AppendLLMDChain appends to dst the hashes LLMDChain computes, for at most
// maxBlocks leading blocks (all when maxBlocks <= 0).
func AppendLLMDChain(dst []uint64, seed, model string, tokens []uint32, blockSize, maxBlocks int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	if n := len(tokens) / blockSize; maxBlocks <= 0 || maxBlocks > n {
		maxBlocks = n
	}
	h := fnv.New64a()
	h.Write([]byte(seed))
	// The root: [seed hash, nil, model].
	var e cborBuf
	e.b = make([]byte, 0, 32+len(model)+5*blockSize)
	e.head(4, 3)
	e.head(0, h.Sum64())
	e.b = append(e.b, cborNull)
	e.head(3, uint64(len(model)))
	e.b = append(e.b, model...)
	parent := e.fnv()
	chain := dst
	for i := 0; i < maxBlocks*blockSize; i += blockSize {
		// A block: [parent, tokens, nil].
		e.b = e.b[:0]
		e.head(4, 3)
		e.head(0, parent)
		e.head(4, uint64(blockSize))
		for _, t := range tokens[i : i+blockSize] {
			e.head(0, uint64(t))
		}
		e.b = append(e.b, cborNull)
		parent = e.fnv()
		chain = append(chain, parent)
	}
	return chain
}

const cborNull = 0xf6

// cborBuf writes the few canonical CBOR items the hash needs: heads in
// their shortest form.
type cborBuf struct{ b []byte }

func (e *cborBuf) head(major byte, v uint64) {
	switch {
	case v < 24:
		e.b = append(e.b, major<<5|byte(v))
	case v <= 0xff:
		e.b = append(e.b, major<<5|24, byte(v))
	case v <= 0xffff:
		e.b = binary.BigEndian.AppendUint16(append(e.b, major<<5|25), uint16(v))
	case v <= 0xffffffff:
		e.b = binary.BigEndian.AppendUint32(append(e.b, major<<5|26), uint32(v))
	default:
		e.b = binary.BigEndian.AppendUint64(append(e.b, major<<5|27), v)
	}
}

// fnv is FNV-64a of the buffer, inline: hash/fnv's digest would escape.
func (e *cborBuf) fnv() uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for _, c := range e.b {
		h ^= uint64(c)
		h *= prime
	}
	return h
}
