package s3origin

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// A copy checked from the CRCs of its ranges passes when they and the bytes
// read back for the gaps match the object, and fails on a wrong CRC, a bad
// byte in a gap and overlapping ranges. An object without a full-object CRC
// gets no range check.
func TestRangeCheck(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	data := randomBytes(11, 5<<20+123)
	s.PutObject(t, bucket, "m/r.bin", bytes.NewReader(data), int64(len(data)))
	c := newOrigin(t, s, s.Endpoint, Options{})
	o := listOne(t, c.Client, "m/r.bin")
	rc, err := c.NewRangeCheck(context.Background(), o)
	if err != nil || rc == nil {
		t.Fatalf("NewRangeCheck = %v, %v; want a check (the gateway stores a full-object CRC)", rc, err)
	}
	crcOf := func(off, n int64) RangeCRC {
		return RangeCRC{Off: off, Len: n, CRC: rc.Update(0, data[off:off+n])}
	}
	const mib = 1 << 20
	// Out of order, with gaps at the start, in the middle and at the end.
	known := []RangeCRC{crcOf(3*mib, mib), crcOf(mib, mib), crcOf(2*mib, mib)}
	f := tempFile(t)
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	v, err := rc.Verify(context.Background(), f, known)
	if err != nil || !v.Verified || !strings.Contains(v.Detail, "(2097275 of 5243003 bytes read back)") {
		t.Fatalf("Verify = %+v, %v; want verified with 2 MiB + 123 bytes read back", v, err)
	}
	all := []RangeCRC{crcOf(0, int64(len(data)))}
	if v, err := rc.Verify(context.Background(), f, all); err != nil || !strings.Contains(v.Detail, "(0 of") {
		t.Fatalf("Verify with every range known = %+v, %v", v, err)
	}

	wrong := append([]RangeCRC(nil), known...)
	wrong[1].CRC ^= 1
	if _, err := rc.Verify(context.Background(), f, wrong); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Verify with a wrong range CRC = %v, want ErrCorrupt", err)
	}
	overlap := append([]RangeCRC(nil), known...)
	overlap[0].Off -= 10
	if _, err := rc.Verify(context.Background(), f, overlap); err == nil || errors.Is(err, ErrCorrupt) {
		t.Errorf("Verify with overlapping ranges = %v, want an error that says so", err)
	}
	if _, err := rc.Verify(context.Background(), f, []RangeCRC{crcOf(int64(len(data))-10, 10), {Off: int64(len(data)) - 5, Len: 10}}); err == nil {
		t.Error("Verify with a range past the end passed")
	}
	if _, err := f.WriteAt([]byte{data[5*mib+7] ^ 0x40}, 5*mib+7); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Verify(context.Background(), f, known); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Verify with a bad byte in a gap = %v, want ErrCorrupt", err)
	}

	c.ignoreChecksums = true
	if rc, err := c.NewRangeCheck(context.Background(), o); err != nil || rc != nil {
		t.Errorf("NewRangeCheck without a CRC = %v, %v; want nil, nil", rc, err)
	}
}
