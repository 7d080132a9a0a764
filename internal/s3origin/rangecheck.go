package s3origin

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
)

// RangeCheck verifies a local copy of an object whose full-object
// checksum is a CRC from the CRCs of its ranges, taken while the bytes
// arrived: a copy filled piece by piece (the swarm) then needs no read-back
// at the end, where the last file's check would hold up the model's
// readiness. Ranges without a CRC (filled by an earlier run) are read back.
type RangeCheck struct {
	c    *Client
	obj  Object
	chk  check
	kind *crcKind
}

// RangeCRC is the CRC of Len bytes of an object at Off.
type RangeCRC struct {
	Off, Len int64
	CRC      uint64
}

// NewRangeCheck asks S3 how obj can be checked (and that it is still the
// object listed). It returns nil and no error when the object's digest is
// not a CRC; Verify then reads the copy back.
func (c *Client) NewRangeCheck(ctx context.Context, obj Object) (*RangeCheck, error) {
	chk, err := c.inspect(ctx, obj)
	if err != nil {
		return nil, err
	}
	kind := crcKindFor(chk.method)
	if kind == nil {
		return nil, nil
	}
	return &RangeCheck{c: c, obj: obj, chk: chk, kind: kind}, nil
}

// Update continues a range's CRC over p; a range's CRC starts at 0.
func (rc *RangeCheck) Update(crc uint64, p []byte) uint64 { return rc.kind.update(crc, p) }

// Verify combines known (ranges of the object, none overlapping, in any
// order) and the CRCs of the gaps between them, read back from r, and
// compares the result with the object's checksum.
func (rc *RangeCheck) Verify(ctx context.Context, r io.ReaderAt, known []RangeCRC) (Verification, error) {
	what := "verify " + rc.obj.URL()
	known = slices.SortedFunc(slices.Values(known), func(a, b RangeCRC) int { return cmp.Compare(a.Off, b.Off) })
	var got uint64
	var buf []byte
	readBack := func(off, n int64) error {
		if buf == nil {
			buf = make([]byte, readBackBuf)
		}
		var crc uint64
		if err := readRange(ctx, r, off, n, buf, func(p []byte) { crc = rc.kind.update(crc, p) }); err != nil {
			return fmt.Errorf("%s: read back: %w", what, err)
		}
		got = rc.kind.combine(got, crc, n)
		return nil
	}
	at, gaps := int64(0), int64(0)
	for _, k := range known {
		if k.Off < at || k.Len < 0 || k.Off+k.Len > rc.obj.Size {
			return Verification{}, fmt.Errorf("%s: range %d+%d overlaps another or lies outside %d bytes", what, k.Off, k.Len, rc.obj.Size)
		}
		if k.Off > at {
			if err := readBack(at, k.Off-at); err != nil {
				return Verification{}, err
			}
			gaps += k.Off - at
		}
		got = rc.kind.combine(got, k.CRC, k.Len)
		at = k.Off + k.Len
	}
	if at < rc.obj.Size {
		if err := readBack(at, rc.obj.Size-at); err != nil {
			return Verification{}, err
		}
		gaps += rc.obj.Size - at
	}
	return rc.c.compareCombined(rc.obj, rc.kind, rc.chk, got, fmt.Sprintf("checked while filling (%d of %d bytes read back)", gaps, rc.obj.Size))
}
