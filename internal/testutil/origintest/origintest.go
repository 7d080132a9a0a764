// Package origintest is the conformance suite of origin.Origin: one set of
// tests that every origin the daemon may fetch through passes (the S3
// client against a real versitygw, origin/memorigin in memory), so the
// daemon's tests on the in-memory one say something of S3 too.
//
// Run covers listing (paths, sizes, folder markers, other prefixes, errors
// that name the listing), not
// found (an empty prefix, a missing bucket, a deleted object), bad keys,
// ranged reads, downloads with resume (parts already done are not read
// again), and verification: a good copy passes, a damaged one is
// ErrCorrupt, a changed object ErrSourceChanged, through Verify, Download
// and the RangeCheck when the origin offers one.
package origintest

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/warmfleet/warmfleet/origin"
)

// Fixture is an origin under test and the hands that change what it holds.
type Fixture struct {
	Origin origin.Origin
	// Bucket exists and is empty; Missing names a bucket that does not
	// exist.
	Bucket, Missing string
	// PartSize is Download's part size.
	PartSize int64
	// Put stores data as Bucket/key; Delete removes Bucket/key.
	Put    func(t *testing.T, key string, data []byte)
	Delete func(t *testing.T, key string)
	// Bytes is how many object bytes the origin has read so far (its
	// OnBytes total).
	Bytes func() int64
	// Source, if not nil, names the files Put under prefix as a source
	// (called after they are Put); nil names s3://Bucket/prefix.
	Source func(prefix string) string
	// Immutable marks a content-addressed source (a torrent): nothing it
	// listed changes or goes away, its objects need not carry Bucket, and
	// equal bytes in two files need not share an ETag (a v1 torrent's
	// files have no digest of their own). The tests of those are skipped.
	Immutable bool
}

// Run runs the suite on the fixture newFixture builds (once: the subtests
// use prefixes of their own).
func Run(t *testing.T, newFixture func(t *testing.T) Fixture) {
	fx := newFixture(t)
	src := func(prefix string) string { return "s3://" + fx.Bucket + "/" + prefix }
	if fx.Source != nil {
		src = fx.Source
	}
	t.Run("List", func(t *testing.T) { testList(t, fx, src) })
	t.Run("NotFound", func(t *testing.T) { testNotFound(t, fx, src) })
	t.Run("BadKeys", func(t *testing.T) { testBadKeys(t, fx, src) })
	t.Run("OpenRange", func(t *testing.T) { testOpenRange(t, fx, src) })
	t.Run("DownloadResumes", func(t *testing.T) { testDownload(t, fx, src) })
	t.Run("Verify", func(t *testing.T) { testVerify(t, fx, src) })
	t.Run("ChangedObject", func(t *testing.T) { testChanged(t, fx, src) })
}

// Bytes returns n reproducible random bytes.
func Bytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}).Read(b)
	return b
}

// listed lists source and returns the object at key.
func listed(t *testing.T, fx Fixture, source, key string) origin.Object {
	t.Helper()
	objs, err := fx.Origin.List(t.Context(), source)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.Key == key {
			return o
		}
	}
	t.Fatalf("%s not listed under %s: %+v", key, source, objs)
	return origin.Object{}
}

func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "copy"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func testList(t *testing.T, fx Fixture, src func(string) string) {
	files := map[string][]byte{"list/a.bin": Bytes(1, 1000), "list/sub/b.bin": Bytes(2, 10), "list/empty.bin": nil, "list/same.bin": Bytes(1, 1000)}
	for k, v := range files {
		fx.Put(t, k, v)
	}
	fx.Put(t, "list/folder/", nil) // a console's folder marker
	fx.Put(t, "list-other/x.bin", []byte("x"))
	objs, err := fx.Origin.List(t.Context(), src("list/"))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, o := range objs {
		paths = append(paths, o.Path)
		if (o.Bucket != fx.Bucket && !fx.Immutable) || o.Key != "list/"+o.Path || o.Size != int64(len(files[o.Key])) || o.ETag == "" || strings.Contains(o.ETag, `"`) {
			t.Errorf("listed %+v", o)
		}
	}
	if want := []string{"a.bin", "empty.bin", "same.bin", "sub/b.bin"}; !slices.Equal(paths, want) {
		t.Fatalf("listed %q, want %q", paths, want)
	}
	// Same bytes, same ETag: a revision whose content comes back is the
	// same revision.
	if !fx.Immutable && (objs[0].ETag != objs[2].ETag || objs[0].ETag == objs[3].ETag) {
		t.Errorf("ETags %q %q %q: want equal ones for equal content only", objs[0].ETag, objs[2].ETag, objs[3].ETag)
	}
	_, err = fx.Origin.List(t.Context(), "http://"+fx.Bucket+"/list/")
	if err == nil {
		t.Error("listed a source that is not s3://")
	}
	namesListing(t, "a source that is not s3://", err)
}

// namesListing checks that a List error begins with "list ": the daemon
// passes it on as it is.
func namesListing(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && !strings.HasPrefix(err.Error(), "list ") {
		t.Errorf("%s: %q does not name the listing (want \"list SOURCE: ...\")", what, err)
	}
}

func testNotFound(t *testing.T, fx Fixture, src func(string) string) {
	if fx.Immutable {
		t.Skip("an immutable source loses nothing it listed")
	}
	_, err := fx.Origin.List(t.Context(), src("nothing/"))
	if !errors.Is(err, origin.ErrEmpty) || !strings.Contains(err.Error(), "nothing/") {
		t.Errorf("empty prefix: %v, want ErrEmpty naming it", err)
	}
	namesListing(t, "empty prefix", err)
	_, err = fx.Origin.List(t.Context(), "s3://"+fx.Missing+"/m/")
	if !errors.Is(err, origin.ErrNoSuchBucket) {
		t.Errorf("missing bucket: %v, want ErrNoSuchBucket", err)
	}
	namesListing(t, "missing bucket", err)
	fx.Put(t, "gone/a.bin", Bytes(3, 100))
	obj := listed(t, fx, src("gone/"), "gone/a.bin")
	fx.Delete(t, "gone/a.bin")
	if err := fx.Origin.Download(t.Context(), obj, tempFile(t), origin.Plan{}); !errors.Is(err, origin.ErrNotFound) {
		t.Errorf("download of a deleted object: %v, want ErrNotFound", err)
	}
	if _, err := fx.Origin.Verify(t.Context(), obj, bytes.NewReader(Bytes(3, 100))); !errors.Is(err, origin.ErrNotFound) {
		t.Errorf("verify against a deleted object: %v, want ErrNotFound", err)
	}
}

// Keys a real S3 stores but no local path can be: a backslash (versitygw
// normalises "..", "//" and absolute keys on PUT, so those are covered by
// s3origin's table test only).
func testBadKeys(t *testing.T, fx Fixture, src func(string) string) {
	fx.Put(t, "bad/ok.bin", []byte("x"))
	fx.Put(t, `bad/..\evil`, []byte("x"))
	_, err := fx.Origin.List(t.Context(), src("bad/"))
	if !errors.Is(err, origin.ErrUnsafeKey) || !strings.Contains(err.Error(), `..\\evil`) {
		t.Fatalf("List = %v, want ErrUnsafeKey naming the key", err)
	}
	namesListing(t, "unsafe key", err)
}

func testOpenRange(t *testing.T, fx Fixture, src func(string) string) {
	data := Bytes(4, 3*int(fx.PartSize)/2+7)
	fx.Put(t, "range/r.bin", data)
	obj := listed(t, fx, src("range/"), "range/r.bin")
	size := int64(len(data))
	for _, r := range [][2]int64{{0, size}, {0, 1}, {size - 1, 1}, {fx.PartSize - 3, 10}, {5, 0}} {
		before := fx.Bytes()
		rc, err := fx.Origin.OpenRange(t.Context(), obj, r[0], r[1])
		if err != nil {
			t.Fatalf("OpenRange(%d, %d): %v", r[0], r[1], err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
			t.Fatalf("OpenRange(%d, %d): %d bytes, %v; want the object's bytes there", r[0], r[1], len(got), err)
		}
		if n := fx.Bytes() - before; n != r[1] {
			t.Errorf("OpenRange(%d, %d) counted %d bytes read", r[0], r[1], n)
		}
	}
}

func testDownload(t *testing.T, fx Fixture, src func(string) string) {
	data := Bytes(5, 3*int(fx.PartSize)+5)
	fx.Put(t, "dl/m.bin", data)
	obj := listed(t, fx, src("dl/"), "dl/m.bin")
	parts := origin.Parts(obj.Size, fx.PartSize)

	// A first run did parts 0 and 2: they are on disk and not read again.
	dst := tempFile(t)
	done := map[int]bool{0: true, 2: true}
	var skipped int64
	for p := range done {
		off, n := origin.PartRange(p, obj.Size, fx.PartSize)
		if _, err := dst.WriteAt(data[off:off+n], off); err != nil {
			t.Fatal(err)
		}
		skipped += n
	}
	var mu sync.Mutex
	got := map[int]int64{}
	var v origin.Verification
	before := fx.Bytes()
	err := fx.Origin.Download(t.Context(), obj, dst, origin.Plan{
		Done: func(p int) bool { return done[p] },
		OnPart: func(p int, n int64) {
			mu.Lock()
			defer mu.Unlock()
			got[p] += n
		},
		OnVerify: func(x origin.Verification) { v = x },
	})
	if err != nil {
		t.Fatal(err)
	}
	for p := range parts {
		_, n := origin.PartRange(p, obj.Size, fx.PartSize)
		if done[p] && got[p] != 0 || !done[p] && got[p] != n {
			t.Errorf("OnPart(%d) got %d bytes (done before: %v, part of %d bytes)", p, got[p], done[p], n)
		}
	}
	if n := fx.Bytes() - before; n != obj.Size-skipped {
		t.Errorf("read %d bytes from the origin, want %d (the parts not done)", n, obj.Size-skipped)
	}
	if !v.Verified {
		t.Errorf("OnVerify got %+v, want verified", v)
	}
	if b, err := os.ReadFile(dst.Name()); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("copy differs from the object (%v)", err)
	}

	// A part recorded done over bytes that are not the object's: the
	// end-to-end check catches it (OnVerify, if called, says so too).
	bad := tempFile(t)
	if _, err := bad.WriteAt(make([]byte, fx.PartSize), 0); err != nil {
		t.Fatal(err)
	}
	v = origin.Verification{}
	err = fx.Origin.Download(t.Context(), obj, bad, origin.Plan{Done: func(p int) bool { return p == 0 }, OnVerify: func(x origin.Verification) { v = x }})
	if !errors.Is(err, origin.ErrCorrupt) || v.Verified {
		t.Fatalf("download over a bad done part: %v, verification %+v; want ErrCorrupt, not verified", err, v)
	}
}

func testVerify(t *testing.T, fx Fixture, src func(string) string) {
	data := Bytes(6, 2*int(fx.PartSize)+11)
	fx.Put(t, "verify/v.bin", data)
	obj := listed(t, fx, src("verify/"), "verify/v.bin")
	v, err := fx.Origin.Verify(t.Context(), obj, bytes.NewReader(data))
	if err != nil || !v.Verified || v.Method == "" {
		t.Fatalf("Verify of a good copy = %+v, %v", v, err)
	}
	flipped := bytes.Clone(data)
	flipped[len(flipped)/2] ^= 1
	if _, err := fx.Origin.Verify(t.Context(), obj, bytes.NewReader(flipped)); !errors.Is(err, origin.ErrCorrupt) {
		t.Errorf("Verify of a flipped byte = %v, want ErrCorrupt", err)
	}

	rc, err := fx.Origin.NewRangeCheck(t.Context(), obj)
	if err != nil {
		t.Fatal(err)
	}
	if rc == nil {
		return // the object's digest is no CRC: Verify reads back
	}
	half := obj.Size / 2
	known := []origin.RangeCRC{
		{Off: half, Len: obj.Size - half, CRC: rc.Update(rc.Update(0, data[half:half+5]), data[half+5:])},
		{Off: 0, Len: 100, CRC: rc.Update(0, data[:100])},
	}
	if v, err := rc.Verify(t.Context(), bytes.NewReader(data), known); err != nil || !v.Verified {
		t.Errorf("RangeCheck.Verify of a good copy = %+v, %v", v, err)
	}
	known[1].CRC ^= 1
	if _, err := rc.Verify(t.Context(), bytes.NewReader(data), known); !errors.Is(err, origin.ErrCorrupt) {
		t.Errorf("RangeCheck.Verify with a wrong range CRC = %v, want ErrCorrupt", err)
	}
	known[1].CRC ^= 1
	if _, err := rc.Verify(t.Context(), bytes.NewReader(flipped), known[1:]); !errors.Is(err, origin.ErrCorrupt) {
		t.Errorf("RangeCheck.Verify with a flipped byte read back = %v, want ErrCorrupt", err)
	}
}

func testChanged(t *testing.T, fx Fixture, src func(string) string) {
	if fx.Immutable {
		t.Skip("an immutable source does not change")
	}
	data := Bytes(7, int(fx.PartSize)+3)
	fx.Put(t, "changed/c.bin", data)
	obj := listed(t, fx, src("changed/"), "changed/c.bin")
	fx.Put(t, "changed/c.bin", Bytes(8, int(fx.PartSize)+3))
	if _, err := fx.Origin.Verify(t.Context(), obj, bytes.NewReader(data)); !errors.Is(err, origin.ErrSourceChanged) {
		t.Errorf("Verify after the object changed = %v, want ErrSourceChanged", err)
	}
	if err := fx.Origin.Download(t.Context(), obj, tempFile(t), origin.Plan{}); !errors.Is(err, origin.ErrSourceChanged) {
		t.Errorf("Download after the object changed = %v, want ErrSourceChanged", err)
	}
	rc, err := fx.Origin.OpenRange(t.Context(), obj, 0, 10)
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if !errors.Is(err, origin.ErrSourceChanged) {
		t.Errorf("OpenRange after the object changed = %v, want ErrSourceChanged", err)
	}
}
