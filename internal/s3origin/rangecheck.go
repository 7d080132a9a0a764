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
	got, readBack, err := rc.c.combineCRCs(ctx, rc.obj, rc.kind, r, known)
	if err != nil {
		return Verification{}, fmt.Errorf("verify %s: %w", rc.obj.URL(), err)
	}
	return rc.c.compareCombined(rc.obj, rc.kind, rc.chk, got, fmt.Sprintf("checked while filling (%d of %d bytes read back)", readBack, rc.obj.Size))
}

// combineCRCs returns the CRC of the whole object from known (ranges with
// their CRCs, none overlapping, in any order) and from the gaps between
// them, read back from r in parts in parallel, with the bytes read back.
// Every CRC check goes through it: a read-back (nothing known), a download
// (the parts an earlier run fetched are the gaps) and a swarm fill.
func (c *Client) combineCRCs(ctx context.Context, obj Object, kind *crcKind, r io.ReaderAt, known []RangeCRC) (crc uint64, readBack int64, err error) {
	known = slices.SortedFunc(slices.Values(known), func(a, b RangeCRC) int { return cmp.Compare(a.Off, b.Off) })
	var all []RangeCRC // the object, in order: known ranges and gap parts
	var gaps []int     // indexes in all of the parts to read back
	addGap := func(off, end int64) {
		for ; off < end; off += c.opts.PartSize {
			gaps = append(gaps, len(all))
			all = append(all, RangeCRC{Off: off, Len: min(c.opts.PartSize, end-off)})
		}
	}
	at := int64(0)
	for _, k := range known {
		if k.Off < at || k.Len < 0 || k.Off+k.Len > obj.Size {
			return 0, 0, fmt.Errorf("range %d+%d overlaps another or lies outside %d bytes", k.Off, k.Len, obj.Size)
		}
		readBack += k.Off - at
		addGap(at, k.Off)
		all = append(all, k)
		at = k.Off + k.Len
	}
	readBack += obj.Size - at
	addGap(at, obj.Size)
	err = forEachPart(ctx, len(gaps), func(i int, buf []byte) error {
		g := &all[gaps[i]]
		return ReadRange(ctx, r, g.Off, g.Len, buf, func(p []byte) { g.CRC = kind.update(g.CRC, p) })
	})
	if err != nil {
		return 0, 0, fmt.Errorf("read back: %w", err)
	}
	for _, k := range all {
		crc = kind.combine(crc, k.CRC, k.Len)
	}
	return crc, readBack, nil
}
