package kvevents

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
//
// The CBOR is never built: each item's bytes go into the hash as they are
// encoded, so a prompt costs one pass and no memory. This is the router's
// per-request work for token-id prompts, and FNV's multiply per byte,
// which no encoding can shorten, is most of it: ChainCache spares it for
// the blocks it has seen.
func AppendLLMDChain(dst []uint64, seed, model string, tokens []uint32, blockSize, maxBlocks int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	if n := len(tokens) / blockSize; maxBlocks <= 0 || maxBlocks > n {
		maxBlocks = n
	}
	return appendLLMDBlocks(dst, llmdRoot(seed, model), tokens, blockSize, maxBlocks)
}

// llmdRoot is the first block's parent: [seed hash, nil, model].
func llmdRoot(seed, model string) uint64 {
	h := fnvByte(fnvOffset, 4<<5|3)
	h = fnvHead(h, 0, fnvString(fnvOffset, seed))
	h = fnvByte(h, cborNull)
	h = fnvHead(h, 3, uint64(len(model)))
	return fnvString(h, model)
}

// appendLLMDBlocks appends the hashes of tokens' first n blocks, the first
// one's parent being parent.
func appendLLMDBlocks(dst []uint64, parent uint64, tokens []uint32, blockSize, n int) []uint64 {
	for i := 0; i < n*blockSize; i += blockSize {
		// A block: [parent, tokens, nil].
		h := fnvHead(fnvByte(fnvOffset, 4<<5|3), 0, parent)
		h = fnvHead(h, 4, uint64(blockSize))
		parent = fnvByte(fnvTokens(h, tokens[i:i+blockSize]), cborNull)
		dst = append(dst, parent)
	}
	return dst
}

const (
	cborNull  = 0xf6
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnvByte is one step of FNV-64a.
func fnvByte(h uint64, c byte) uint64 { return (h ^ uint64(c)) * fnvPrime }

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = fnvByte(h, s[i])
	}
	return h
}

// fnvHead hashes a canonical CBOR head (major type, argument in its
// shortest form).
func fnvHead(h uint64, major byte, v uint64) uint64 {
	m := major << 5
	switch {
	case v < 24:
		return fnvByte(h, m|byte(v))
	case v <= 0xff:
		return fnvByte(fnvByte(h, m|24), byte(v))
	case v <= 0xffff:
		return fnvByte(fnvByte(fnvByte(h, m|25), byte(v>>8)), byte(v))
	case v <= 0xffffffff:
		return fnvBE32(fnvByte(h, m|26), uint32(v))
	}
	return fnvBE32(fnvBE32(fnvByte(h, m|27), uint32(v>>32)), uint32(v))
}

// fnvTokens is fnvHead(h, 0, t) for each of toks in turn: the per-token
// work of a prompt the router has not seen, most of it FNV's multiply per
// byte. The heads are written out in the loop rather than called for:
// a call per token, with the hash and the loop's state saved around it,
// cost as much again as the hashing.
func fnvTokens(h uint64, toks []uint32) uint64 {
	for _, t := range toks {
		switch {
		case t > 0xffff:
			h = fnvByte(fnvByte(h, 26), byte(t>>24))
			h = fnvByte(fnvByte(fnvByte(h, byte(t>>16)), byte(t>>8)), byte(t))
		case t > 0xff:
			h = fnvByte(fnvByte(fnvByte(h, 25), byte(t>>8)), byte(t))
		case t >= 24:
			h = fnvByte(fnvByte(h, 24), byte(t))
		default:
			h = fnvByte(h, byte(t))
		}
	}
	return h
}

func fnvBE32(h uint64, v uint32) uint64 {
	return fnvByte(fnvByte(fnvByte(fnvByte(h, byte(v>>24)), byte(v>>16)), byte(v>>8)), byte(v))
}
