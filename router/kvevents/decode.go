package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is the type of a KV-cache event.
type Kind uint8

// The event kinds vLLM publishes, named by their msgpack tags.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one decoded KV-cache event. Only what indexing needs is kept:
// the token ids are skipped (bounded) since the block hashes already name
// the blocks.
type Event struct {
	Kind Kind
	// Hashes are the blocks stored or removed, in chain order for
	// BlockStored. A hash published as bytes is reduced to its last 8
	// bytes read big-endian, which is exactly the int vLLM publishes for
	// the same block when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on.
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0]; HasParent is false
	// for a chain that starts at the prompt's first block.
	Parent    uint64
	HasParent bool
	BlockSize int
	// Medium is the tier the blocks live in ("GPU", "CPU", ...); empty
	// when the engine did not say, which vLLM means as the GPU.
	Medium string
}

// Batch is one published message: the events of one engine step.
type Batch struct {
	TS     float64
	Events []Event
	// Skipped counts events with a tag this decoder does not know (a newer
	// engine's): they are skipped, not an error, so a rolling upgrade of
	// the engines does not blind the router.
	Skipped int
}

// Limits bound what one frame may make the decoder allocate.
type Limits struct {
	MaxFrame      int // bytes of the payload frame
	MaxEvents     int // events in one batch
	MaxHashes     int // block hashes in one event
	MaxTokens     int // token ids in one event (skipped, but counted)
	MaxDepth      int // nesting of values skipped as unknown
	MaxBlocks     int // blocks held per backend by the Index
	MaxTopicBytes int // bytes of the topic frame
}

// DefaultLimits fits vLLM's defaults (batches of one engine step, block
// size 16, prompts up to a few hundred thousand tokens) with room to spare.
func DefaultLimits() Limits {
	return Limits{
		MaxFrame:      4 << 20,
		MaxEvents:     4096,
		MaxHashes:     32768,
		MaxTokens:     1 << 20,
		MaxDepth:      16,
		MaxBlocks:     1 << 20,
		MaxTopicBytes: 1024,
	}
}

// ErrMalformed wraps every decoding failure.
var ErrMalformed = errors.New("malformed KV event frame")

type decoder struct {
	r   *bytes.Reader
	d   *msgpack.Decoder
	lim Limits
}

func (dc *decoder) fail(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// DecodeBatch decodes a KVEventBatch payload: the msgpack array
// [ts, [event...], data_parallel_rank?] (a map {"ts","events"} is also
// accepted), each event either the array form [tag, fields...] or the map
// form {"type": tag, "field": value...}. Every length is checked against
// lim and against the bytes left before anything is allocated for it.
func DecodeBatch(payload []byte, lim Limits) (Batch, error) {
	if len(payload) > lim.MaxFrame {
		return Batch{}, fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrMalformed, len(payload), lim.MaxFrame)
	}
	r := bytes.NewReader(payload)
	dc := &decoder{r: r, d: msgpack.NewDecoder(r), lim: lim}
	b, err := dc.batch()
	if err != nil {
		return Batch{}, err
	}
	if r.Len() != 0 {
		return Batch{}, dc.fail("%d trailing bytes", r.Len())
	}
	return b, nil
}

// length checks a claimed element count: at least one byte per element
// must remain, so a forged count cannot make us allocate.
func (dc *decoder) length(n int, max int, what string) error {
	if n < 0 {
		return dc.fail("%s is nil", what)
	}
	if n > max {
		return dc.fail("%s has %d elements, limit %d", what, n, max)
	}
	if n > dc.r.Len() {
		return dc.fail("%s claims %d elements, %d bytes left", what, n, dc.r.Len())
	}
	return nil
}

func (dc *decoder) peek() (byte, error) {
	c, err := dc.d.PeekCode()
	if err != nil {
		return 0, dc.fail("truncated: %v", err)
	}
	return c, nil
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func (dc *decoder) batch() (Batch, error) {
	c, err := dc.peek()
	if err != nil {
		return Batch{}, err
	}
	var b Batch
	switch {
	case isArray(c):
		n, err := dc.d.DecodeArrayLen()
		if err != nil || n < 2 || n > 3 {
			return Batch{}, dc.fail("batch array of %d fields (err %v)", n, err)
		}
		if b.TS, err = dc.d.DecodeFloat64(); err != nil {
			return Batch{}, dc.fail("batch ts: %v", err)
		}
		if err := dc.events(&b); err != nil {
			return Batch{}, err
		}
		if n == 3 {
			if err := dc.skip(0); err != nil { // data_parallel_rank
				return Batch{}, err
			}
		}
	case isMap(c):
		n, err := dc.d.DecodeMapLen()
		if err != nil {
			return Batch{}, dc.fail("batch map: %v", err)
		}
		if err := dc.length(n, 8, "batch map"); err != nil {
			return Batch{}, err
		}
		seen := false
		for range n {
			key, err := dc.d.DecodeString()
			if err != nil {
				return Batch{}, dc.fail("batch key: %v", err)
			}
			switch key {
			case "ts":
				if b.TS, err = dc.d.DecodeFloat64(); err != nil {
					return Batch{}, dc.fail("batch ts: %v", err)
				}
			case "events":
				if seen {
					return Batch{}, dc.fail("events given twice")
				}
				seen = true
				if err := dc.events(&b); err != nil {
					return Batch{}, err
				}
			default:
				if err := dc.skip(0); err != nil {
					return Batch{}, err
				}
			}
		}
		if !seen {
			return Batch{}, dc.fail("batch map without events")
		}
	default:
		return Batch{}, dc.fail("batch is neither an array nor a map (code 0x%02x)", c)
	}
	return b, nil
}

func (dc *decoder) events(b *Batch) error {
	n, err := dc.d.DecodeArrayLen()
	if err != nil {
		return dc.fail("events: %v", err)
	}
	if err := dc.length(n, dc.lim.MaxEvents, "events"); err != nil {
		return err
	}
	b.Events = make([]Event, 0, n)
	for i := range n {
		ev, known, err := dc.event()
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if !known {
			b.Skipped++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	return nil
}

// Field orders of the array encoding (msgspec array_like, tag first),
// after vLLM's BlockStored/BlockRemoved; fields past the known ones
// (lora_name, extra_keys, group_idx, ... added by later vLLM versions)
// are skipped.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"}
	removedFields = []string{"block_hashes", "medium"}
)

func kindOf(tag string) (Kind, []string) {
	switch tag {
	case "BlockStored":
		return BlockStored, storedFields
	case "BlockRemoved":
		return BlockRemoved, removedFields
	case "AllBlocksCleared":
		return AllBlocksCleared, nil
	}
	return 0, nil
}

func (dc *decoder) event() (ev Event, known bool, err error) {
	c, err := dc.peek()
	if err != nil {
		return ev, false, err
	}
	switch {
	case isArray(c):
		n, err := dc.d.DecodeArrayLen()
		if err != nil {
			return ev, false, dc.fail("event: %v", err)
		}
		if err := dc.length(n, 64, "event"); err != nil {
			return ev, false, err
		}
		if n < 1 {
			return ev, false, dc.fail("event without a tag")
		}
		tag, err := dc.d.DecodeString()
		if err != nil {
			return ev, false, dc.fail("event tag: %v", err)
		}
		kind, fields := kindOf(tag)
		ev.Kind = kind
		for i := 1; i < n; i++ {
			name := ""
			if kind != 0 && i-1 < len(fields) {
				name = fields[i-1]
			}
			if err := dc.field(&ev, name); err != nil {
				return ev, false, err
			}
		}
		if kind == 0 {
			return ev, false, nil
		}
		if kind == BlockStored && n < 5 || kind == BlockRemoved && n < 2 {
			return ev, false, dc.fail("%s with %d fields", kind, n-1)
		}
		return ev, true, nil
	case isMap(c):
		n, err := dc.d.DecodeMapLen()
		if err != nil {
			return ev, false, dc.fail("event: %v", err)
		}
		if err := dc.length(n, 64, "event map"); err != nil {
			return ev, false, err
		}
		// The tag may come after the fields, so fields are decoded by name
		// whatever the tag, and the tag decides at the end.
		tag, hashes := "", false
		for range n {
			key, err := dc.d.DecodeString()
			if err != nil {
				return ev, false, dc.fail("event key: %v", err)
			}
			switch key {
			case "type":
				if tag, err = dc.d.DecodeString(); err != nil {
					return ev, false, dc.fail("event type: %v", err)
				}
			case "block_hashes":
				hashes = true
				fallthrough
			case "parent_block_hash", "token_ids", "block_size", "medium":
				if err := dc.field(&ev, key); err != nil {
					return ev, false, err
				}
			default:
				if err := dc.skip(0); err != nil {
					return ev, false, err
				}
			}
		}
		if tag == "" {
			return ev, false, dc.fail("map event without a type")
		}
		kind, _ := kindOf(tag)
		if kind == 0 {
			return ev, false, nil
		}
		if kind != AllBlocksCleared && !hashes {
			return ev, false, dc.fail("%s without block_hashes", kind)
		}
		ev.Kind = kind
		if kind != BlockStored {
			ev.Parent, ev.HasParent, ev.BlockSize = 0, false, 0
		}
		return ev, true, nil
	}
	return ev, false, dc.fail("event is neither an array nor a map (code 0x%02x)", c)
}

func (dc *decoder) field(ev *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.Hashes, err = dc.hashes()
	case "parent_block_hash":
		var c byte
		if c, err = dc.peek(); err == nil && c == msgpcode.Nil {
			err = dc.d.DecodeNil()
			ev.HasParent = false
		} else if err == nil {
			ev.Parent, err = dc.hash()
			ev.HasParent = err == nil
		}
	case "token_ids":
		var n int
		if n, err = dc.d.DecodeArrayLen(); err != nil {
			return dc.fail("token_ids: %v", err)
		}
		if err := dc.length(n, dc.lim.MaxTokens, "token_ids"); err != nil {
			return err
		}
		for range n {
			if _, err := dc.d.DecodeInt64(); err != nil {
				return dc.fail("token id: %v", err)
			}
		}
	case "block_size":
		var n int64
		if n, err = dc.d.DecodeInt64(); err == nil && (n < 0 || n > 1<<20) {
			return dc.fail("block_size %d", n)
		}
		ev.BlockSize = int(n)
	case "medium":
		var c byte
		if c, err = dc.peek(); err == nil && c == msgpcode.Nil {
			err = dc.d.DecodeNil()
		} else if err == nil {
			ev.Medium, err = dc.d.DecodeString()
			if err == nil && len(ev.Medium) > 64 {
				return dc.fail("medium of %d bytes", len(ev.Medium))
			}
		}
	default:
		return dc.skip(0)
	}
	if err != nil && !errors.Is(err, ErrMalformed) {
		return dc.fail("%s: %v", name, err)
	}
	return err
}

func (dc *decoder) hashes() ([]uint64, error) {
	n, err := dc.d.DecodeArrayLen()
	if err != nil {
		return nil, dc.fail("block_hashes: %v", err)
	}
	if err := dc.length(n, dc.lim.MaxHashes, "block_hashes"); err != nil {
		return nil, err
	}
	hs := make([]uint64, n)
	for i := range hs {
		if hs[i], err = dc.hash(); err != nil {
			return nil, err
		}
	}
	return hs, nil
}

// hash reads an ExternalBlockHash: an int (vLLM's default, and the
// simulator's) or bytes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0),
// reduced as vLLM's own int conversion does: the last 8 bytes, big-endian.
func (dc *decoder) hash() (uint64, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case msgpcode.Bin8, msgpcode.Bin16, msgpcode.Bin32:
		b, err := dc.d.DecodeBytes()
		if err != nil {
			return 0, dc.fail("hash bytes: %v", err)
		}
		if len(b) == 0 || len(b) > 64 {
			return 0, dc.fail("hash of %d bytes", len(b))
		}
		var buf [8]byte
		if len(b) >= 8 {
			copy(buf[:], b[len(b)-8:])
		} else {
			copy(buf[8-len(b):], b)
		}
		return binary.BigEndian.Uint64(buf[:]), nil
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64:
		v, err := dc.d.DecodeUint64()
		if err != nil {
			return 0, dc.fail("hash: %v", err)
		}
		return v, nil
	}
	if msgpcode.IsFixedNum(c) || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64 {
		v, err := dc.d.DecodeInt64()
		if err != nil {
			return 0, dc.fail("hash: %v", err)
		}
		return uint64(v), nil
	}
	return 0, dc.fail("hash is neither an int nor bytes (code 0x%02x)", c)
}

// skip skips one value of any type without recursing deeper than
// lim.MaxDepth (msgpack's own Skip has no depth bound).
func (dc *decoder) skip(depth int) error {
	if depth > dc.lim.MaxDepth {
		return dc.fail("nested deeper than %d", dc.lim.MaxDepth)
	}
	c, err := dc.peek()
	if err != nil {
		return err
	}
	n, per := 0, 0
	switch {
	case isArray(c):
		if n, err = dc.d.DecodeArrayLen(); err != nil {
			return dc.fail("skip: %v", err)
		}
		per = 1
	case isMap(c):
		if n, err = dc.d.DecodeMapLen(); err != nil {
			return dc.fail("skip: %v", err)
		}
		per = 2
	default:
		if err := dc.d.Skip(); err != nil {
			return dc.fail("skip: %v", err)
		}
		return nil
	}
	if n < 0 {
		return nil
	}
	if err := dc.length(n, dc.r.Len(), "skipped value"); err != nil {
		return err
	}
	for range n * per {
		if err := dc.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// isGPU tells whether an event's medium is the accelerator's memory, the
// only tier the router's prefix matching is about.
func isGPU(medium string) bool {
	return medium == "" || strings.EqualFold(medium, "GPU")
}
