// Package peer carries router events between the replicas of one fleet's
// router: each replica streams what it does to every peer over HTTP
// (Link), and applies what its peers stream to it (Handler), so that all
// replicas route from one view of which backend holds which prefix and how
// loaded each backend is.
package peer

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/warmfleet/warmfleet/router"
)

// Limits on what a frame may carry: far above any real prompt (a 16 MiB
// body is at most 2^18 blocks of 64 bytes) or load, and low enough that a
// hostile length cannot make the reader allocate much. Both fit the five
// bytes count reads.
const (
	maxKeys  = 1 << 18
	maxCount = 1 << 30
)

var errFrame = errors.New("peer: bad frame")

// appendEvent encodes e: kind byte, backend (8 bytes, little endian), then
// uvarints: blocks; for Placed the key count and the keys (8 bytes each);
// for Load in-flight and prefilling counts.
func appendEvent(b []byte, e router.Event) []byte {
	b = append(b, byte(e.Kind))
	b = binary.LittleEndian.AppendUint64(b, e.Backend)
	b = binary.AppendUvarint(b, uint64(max(e.Blocks, 0)))
	switch e.Kind {
	case router.Placed:
		b = binary.AppendUvarint(b, uint64(len(e.Keys)))
		for _, k := range e.Keys {
			b = binary.LittleEndian.AppendUint64(b, k)
		}
	case router.Load:
		b = binary.AppendUvarint(b, uint64(max(e.Inflight, 0)))
		b = binary.AppendUvarint(b, uint64(max(e.Prefilling, 0)))
	}
	return b
}

// readEvent decodes one event. io.EOF means the stream ended cleanly
// between frames; anything else that is wrong is an error wrapping
// errFrame (or the reader's own).
func readEvent(r *bufio.Reader) (router.Event, error) {
	kind, err := r.ReadByte()
	if err != nil {
		return router.Event{}, err // io.EOF: a clean end
	}
	e := router.Event{Kind: router.EventKind(kind)}
	switch e.Kind {
	case router.Placed, router.Prefilled, router.Released, router.Load:
	default:
		return router.Event{}, fmt.Errorf("%w: unknown kind %d", errFrame, kind)
	}
	var id [8]byte
	if _, err := io.ReadFull(r, id[:]); err != nil {
		return router.Event{}, truncated(err)
	}
	e.Backend = binary.LittleEndian.Uint64(id[:])
	if e.Blocks, err = count(r, "blocks", maxCount); err != nil {
		return router.Event{}, err
	}
	switch e.Kind {
	case router.Placed:
		n, err := count(r, "keys", maxKeys)
		if err != nil {
			return router.Event{}, err
		}
		if n > 0 {
			e.Keys = make([]uint64, 0, min(n, 4096)) // grows with what arrives
		}
		var k [8]byte
		for range n {
			if _, err := io.ReadFull(r, k[:]); err != nil {
				return router.Event{}, truncated(err)
			}
			e.Keys = append(e.Keys, binary.LittleEndian.Uint64(k[:]))
		}
	case router.Load:
		if e.Inflight, err = count(r, "inflight", maxCount); err != nil {
			return router.Event{}, err
		}
		if e.Prefilling, err = count(r, "prefilling", maxCount); err != nil {
			return router.Event{}, err
		}
	}
	return e, nil
}

// count reads a uvarint of at most limit (below 2^35, so five bytes):
// a longer varint or a larger value is a bad frame.
func count(r *bufio.Reader, what string, limit uint64) (int, error) {
	var v uint64
	for shift := 0; shift < 35; shift += 7 {
		c, err := r.ReadByte()
		if err != nil {
			return 0, truncated(err)
		}
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			if v > limit {
				return 0, fmt.Errorf("%w: %s %d (at most %d)", errFrame, what, v, limit)
			}
			return int(v), nil
		}
	}
	return 0, fmt.Errorf("%w: %s: varint longer than 5 bytes", errFrame, what)
}

// truncated turns an end of stream inside a frame into a bad frame; other
// read errors (a deadline, a reset) pass as they are.
func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated", errFrame)
	}
	return err
}
