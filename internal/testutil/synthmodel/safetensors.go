package synthmodel

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"sort"
)

// Tensor is one entry of a safetensors header. Begin and End are offsets
// into the data that follows the header.
type Tensor struct {
	Name  string
	DType string
	Shape []int64
	Begin int64
	End   int64
}

// Header is a parsed safetensors header.
type Header struct {
	// HeaderSize is the JSON length from the 8-byte prefix; data starts
	// at 8+HeaderSize.
	HeaderSize int64
	Metadata   map[string]string
	// Tensors sorted by Begin; they tile [0, DataSize) without gaps.
	Tensors  []Tensor
	DataSize int64
}

// FileSize is the size a file with this header must have.
func (h Header) FileSize() int64 { return 8 + h.HeaderSize + h.DataSize }

// MaxHeaderSize is the largest JSON header accepted (the reference
// implementation's limit).
const MaxHeaderSize = 100 << 20

var dtypeSizes = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// ParseSafetensorsHeader reads and validates the length prefix and JSON
// header from r, checking what the reference implementation checks: known
// dtypes, offsets that match the shapes, and tensors that cover the data
// contiguously. It reads no tensor data. Input is untrusted.
func ParseSafetensorsHeader(r io.Reader) (Header, error) {
	var prefix [8]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return Header{}, fmt.Errorf("safetensors: reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(prefix[:])
	if n == 0 || n > MaxHeaderSize {
		return Header{}, fmt.Errorf("safetensors: header length %d, want 1..%d", n, MaxHeaderSize)
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(r, js); err != nil {
		return Header{}, fmt.Errorf("safetensors: reading %d-byte header: %w", n, err)
	}
	if js[0] != '{' {
		return Header{}, errors.New("safetensors: header does not start with '{'")
	}
	entries, err := decodeObject(js)
	if err != nil {
		return Header{}, fmt.Errorf("safetensors: header: %w", err)
	}
	h := Header{HeaderSize: int64(n)}
	for _, e := range entries {
		if e.key == "__metadata__" {
			if err := json.Unmarshal(e.raw, &h.Metadata); err != nil {
				return Header{}, fmt.Errorf("safetensors: __metadata__ must map strings to strings: %w", err)
			}
			continue
		}
		t, err := parseTensor(e.key, e.raw)
		if err != nil {
			return Header{}, fmt.Errorf("safetensors: tensor %q: %w", e.key, err)
		}
		h.Tensors = append(h.Tensors, t)
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		return a.Begin < b.Begin || (a.Begin == b.Begin && a.End < b.End)
	})
	for _, t := range h.Tensors {
		if t.Begin != h.DataSize {
			return Header{}, fmt.Errorf("safetensors: tensor %q starts at %d, want %d (tensors must be contiguous)", t.Name, t.Begin, h.DataSize)
		}
		h.DataSize = t.End
	}
	return h, nil
}

type entry struct {
	key string
	raw json.RawMessage
}

// decodeObject decodes one JSON object, keeping key order and rejecting
// duplicate keys (encoding/json would keep the last, letting a header say
// two things about one tensor).
func decodeObject(js []byte) ([]entry, error) {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	seen := map[string]bool{}
	var out []entry
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("object key %v is not a string", tok)
		}
		if seen[key] {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("value of %q: %w", key, err)
		}
		out = append(out, entry{key, raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	// Only padding may follow the object.
	if rest := js[dec.InputOffset():]; len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return nil, errors.New("data after the JSON object")
	}
	return out, nil
}

func parseTensor(name string, raw json.RawMessage) (Tensor, error) {
	var info struct {
		DType       *string  `json:"dtype"`
		Shape       []uint64 `json:"shape"`
		DataOffsets []uint64 `json:"data_offsets"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&info); err != nil {
		return Tensor{}, err
	}
	if info.DType == nil || info.Shape == nil || info.DataOffsets == nil {
		return Tensor{}, errors.New("want dtype, shape and data_offsets")
	}
	size, ok := dtypeSizes[*info.DType]
	if !ok {
		return Tensor{}, fmt.Errorf("unknown dtype %q", *info.DType)
	}
	if len(info.DataOffsets) != 2 {
		return Tensor{}, fmt.Errorf("data_offsets has %d values, want 2", len(info.DataOffsets))
	}
	begin, end := info.DataOffsets[0], info.DataOffsets[1]
	if end < begin || end > math.MaxInt64 {
		return Tensor{}, fmt.Errorf("data_offsets [%d, %d] are not a range", begin, end)
	}
	elems := uint64(1)
	shape := make([]int64, len(info.Shape))
	for i, d := range info.Shape {
		hi, lo := bits.Mul64(elems, d)
		if hi != 0 || lo > math.MaxInt64 {
			return Tensor{}, errors.New("shape overflows")
		}
		elems = lo
		shape[i] = int64(d)
	}
	hi, want := bits.Mul64(elems, uint64(size))
	if hi != 0 || want != end-begin {
		return Tensor{}, fmt.Errorf("shape %v of %s needs %d bytes, data_offsets [%d, %d] hold %d", info.Shape, *info.DType, want, begin, end, end-begin)
	}
	return Tensor{Name: name, DType: *info.DType, Shape: shape, Begin: int64(begin), End: int64(end)}, nil
}

// CheckFile parses path's header and checks the file is exactly as long as
// the header says: a truncated or padded download fails.
func CheckFile(path string) (Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, err
	}
	defer f.Close()
	h, err := ParseSafetensorsHeader(io.LimitReader(f, 8+MaxHeaderSize))
	if err != nil {
		return Header{}, fmt.Errorf("%s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		return Header{}, err
	}
	if st.Size() != h.FileSize() {
		return Header{}, fmt.Errorf("%s: %d bytes, header says %d", path, st.Size(), h.FileSize())
	}
	return h, nil
}
