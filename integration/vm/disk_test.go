package vm

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// newDisk makes a zeroed image of n sectors and opens it.
func newDisk(t *testing.T, sectors int) (*Disk, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(path, make([]byte, sectors*SectorSize), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDisk(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, path
}

func fill(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDiskFlushedWritesSurvive: what a flush covered is on the medium
// whatever the power loss; what came after it is lost under LoseAll, while
// the guest read its own writes all along.
func TestDiskFlushedWritesSurvive(t *testing.T) {
	d, path := newDisk(t, 8)
	if err := d.WriteAt(fill(1, 2*SectorSize), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAt(fill(2, SectorSize), SectorSize); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 2*SectorSize)
	if err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if want := append(fill(1, SectorSize), fill(2, SectorSize)...); !bytes.Equal(got, want) {
		t.Fatalf("the guest does not read its own unflushed write")
	}
	st, err := d.PowerLoss(LoseAll, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 1 || st.LostSectors != 1 {
		t.Errorf("loss %+v: want 1 pending write, 1 sector lost", st)
	}
	if img := readFile(t, path); !bytes.Equal(img[:2*SectorSize], fill(1, 2*SectorSize)) {
		t.Errorf("after the power loss the medium holds %v..., want the flushed 1s only", img[SectorSize:SectorSize+4])
	}
}

// TestDiskKeepAll: a disk that wrote its whole cache back loses nothing,
// and overlapping writes end as the last one left them.
func TestDiskKeepAll(t *testing.T) {
	d, path := newDisk(t, 4)
	for i, off := range []int64{0, SectorSize} {
		if err := d.WriteAt(fill(byte(i+1), 2*SectorSize), off); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.PowerLoss(KeepAll, rand.New(rand.NewPCG(1, 2))); err != nil {
		t.Fatal(err)
	}
	want := append(append(fill(1, SectorSize), fill(2, 2*SectorSize)...), fill(0, SectorSize)...)
	if !bytes.Equal(readFile(t, path), want) {
		t.Errorf("keep-all left a medium other than the guest's last view")
	}
}

// TestDiskKeepSomeTearsAtSectors: under KeepSome every sector of the
// medium holds either what it held before the cut or a version some
// unflushed write gave it, never a mix within a sector; across seeds some
// writes are torn, some lost, some kept.
func TestDiskKeepSomeTearsAtSectors(t *testing.T) {
	var total LossStats
	for seed := range uint64(40) {
		d, path := newDisk(t, 16)
		// Eight writes of 1..4 sectors with distinct bytes.
		rng := rand.New(rand.NewPCG(seed, 0))
		valid := make([]map[byte]bool, 16)
		for s := range valid {
			valid[s] = map[byte]bool{0: true}
		}
		for i := range 8 {
			n := 1 + rng.IntN(4)
			s := rng.IntN(16 - n + 1)
			if err := d.WriteAt(fill(byte(i+1), n*SectorSize), int64(s*SectorSize)); err != nil {
				t.Fatal(err)
			}
			for k := s; k < s+n; k++ {
				valid[k][byte(i+1)] = true
			}
		}
		st, err := d.PowerLoss(KeepSome, rand.New(rand.NewPCG(seed, 1)))
		if err != nil {
			t.Fatal(err)
		}
		total.Pending += st.Pending
		total.Kept += st.Kept
		total.Torn += st.Torn
		img := readFile(t, path)
		for s := range 16 {
			sector := img[s*SectorSize : (s+1)*SectorSize]
			if !bytes.Equal(sector, fill(sector[0], SectorSize)) {
				t.Fatalf("seed %d: sector %d is torn inside", seed, s)
			}
			if !valid[s][sector[0]] {
				t.Fatalf("seed %d: sector %d holds %d, which no write gave it", seed, s, sector[0])
			}
		}
	}
	if total.Kept == 0 || total.Torn == 0 || total.Kept+total.Torn == total.Pending {
		t.Errorf("over 40 seeds: %+v: want writes kept, torn and lost", total)
	}
}

// TestDiskUnalignedWrite: a write that covers part of a sector is widened
// with what was there, so the cache holds whole sectors.
func TestDiskUnalignedWrite(t *testing.T) {
	d, path := newDisk(t, 2)
	if err := d.WriteAt(fill(7, 2*SectorSize), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAt(fill(9, 10), 100); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil { // a clean shutdown writes the cache back
		t.Fatal(err)
	}
	want := fill(7, 2*SectorSize)
	copy(want[100:], fill(9, 10))
	if !bytes.Equal(readFile(t, path), want) {
		t.Errorf("unaligned write: the medium does not hold the old sector around the new bytes")
	}
}

// TestDiskCut: the request that finds the power gone, and every later
// one, is not done; Cut says it happened.
func TestDiskCut(t *testing.T) {
	d, path := newDisk(t, 4)
	d.CutAt(3) // write, flush, then this write finds no power
	if err := d.WriteAt(fill(1, SectorSize), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Cut():
		t.Fatal("cut before its event")
	default:
	}
	if err := d.WriteAt(fill(2, SectorSize), SectorSize); !errors.Is(err, ErrPowerLost) {
		t.Fatalf("write at the cut: %v, want ErrPowerLost", err)
	}
	if err := d.Flush(); !errors.Is(err, ErrPowerLost) {
		t.Fatalf("flush after the cut: %v, want ErrPowerLost", err)
	}
	<-d.Cut()
	if d.Events() != 3 {
		t.Errorf("events = %d, want 3 (nothing counted after the cut)", d.Events())
	}
	if _, err := d.PowerLoss(KeepAll, rand.New(rand.NewPCG(1, 3))); err != nil {
		t.Fatal(err)
	}
	if img := readFile(t, path); !bytes.Equal(img[SectorSize:2*SectorSize], fill(0, SectorSize)) {
		t.Errorf("the write that found the power gone reached the medium")
	}
}

// TestDiskRefusesOutOfRange: requests beyond the disk are errors, not
// file growth.
func TestDiskRefusesOutOfRange(t *testing.T) {
	d, _ := newDisk(t, 2)
	for _, off := range []int64{-1, 2 * SectorSize, SectorSize + 1} {
		if err := d.WriteAt(fill(1, SectorSize), off); err == nil {
			t.Errorf("write at %d accepted", off)
		}
		if err := d.ReadAt(make([]byte, SectorSize), off); err == nil {
			t.Errorf("read at %d accepted", off)
		}
	}
}

// TestDiskCutAfterFlushBurst: the cut comes then events after the first
// run of burst flushes in a row; flushes split by a write do not count.
func TestDiskCutAfterFlushBurst(t *testing.T) {
	d, _ := newDisk(t, 4)
	d.CutAfterFlushBurst(3, 2)
	w := func() error { return d.WriteAt(fill(1, SectorSize), 0) }
	// F F W F F: no burst of 3 yet; then F (3 in a row), W, and the next
	// event (the second after the burst) finds the power gone.
	for i, op := range []func() error{d.Flush, d.Flush, w, d.Flush, d.Flush, d.Flush, w} {
		if err := op(); err != nil {
			t.Fatalf("event %d: %v", i+1, err)
		}
	}
	select {
	case <-d.Cut():
		t.Fatal("cut too early")
	default:
	}
	if err := d.Flush(); !errors.Is(err, ErrPowerLost) {
		t.Fatalf("the second event after the burst: %v, want ErrPowerLost", err)
	}
	if d.Events() != 8 {
		t.Errorf("cut at event %d, want 8", d.Events())
	}
}
