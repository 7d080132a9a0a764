package vm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
)

// SectorSize is the unit a write survives or is lost in: what a disk
// writes atomically.
const SectorSize = 512

// maxPendingBytes bounds the disk's volatile cache. A disk whose cache is
// full writes its oldest entries back on its own, so those survive any
// later power loss, as on real hardware.
const maxPendingBytes = 64 << 20

// ErrPowerLost answers every request that arrives after the power cut.
var ErrPowerLost = errors.New("disk: power lost")

// Disk is a block device with a volatile write cache, the medium the
// guest's data disk lives on. The durable medium is a file on the host;
// every write since the last flush waits in the cache (reads see it), and a
// flush writes the cache back in order. PowerLoss decides what of the
// cache reaches the medium when the power goes.
type Disk struct {
	mu      sync.Mutex
	file    *os.File
	size    int64
	pending []*extent         // unflushed writes, in arrival order
	latest  map[int64]*extent // sector -> the newest pending write covering it
	bytes   int64             // of pending
	events  int               // writes and flushes that arrived
	cutAt   int               // the event that finds the power gone; 0: none
	// burst arms a cut then events after the first run of burst flushes
	// in a row (no write between them); 0: none.
	burst, then int
	flushRun    int           // flushes in a row just now
	cut         chan struct{} // closed at the cut
	dead        bool
	closed      bool
	stats       DiskStats
	trace       []string
}

// extent is one write, sector-aligned.
type extent struct {
	off  int64
	data []byte
}

// DiskStats counts what a disk was asked to do.
type DiskStats struct {
	Writes, Flushes int
	WrittenBytes    int64
	// WrittenBack counts writes the full cache wrote back on its own.
	WrittenBack int
}

// OpenDisk serves the image file at path (its size is the disk's, a
// multiple of SectorSize).
func OpenDisk(path string) (*Disk, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("disk: %w", err)
	}
	if st.Size()%SectorSize != 0 || st.Size() == 0 {
		f.Close()
		return nil, fmt.Errorf("disk: %s is %d bytes, not a positive multiple of %d", path, st.Size(), SectorSize)
	}
	return &Disk{file: f, size: st.Size(), latest: map[int64]*extent{}, cut: make(chan struct{})}, nil
}

// Size is the disk's size in bytes.
func (d *Disk) Size() int64 { return d.size }

// CutAt arranges for the power to go when the n-th write or flush (from
// 1, counted since the disk was opened) arrives: that request and every
// later one are not done. n <= 0 cancels.
func (d *Disk) CutAt(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cutAt, d.burst = n, 0
}

// Cut is closed when the power cut set by CutAt happened.
func (d *Disk) Cut() <-chan struct{} { return d.cut }

// Events is the number of writes and flushes that arrived so far.
func (d *Disk) Events() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.events
}

// Trace lists the writes and flushes that arrived, oldest first (the first
// 100000), as "W<sector>+<sectors>" and "F": where a cut fell, for the
// test's log.
func (d *Disk) Trace() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.trace)
}

// Stats reports what the disk was asked to do.
func (d *Disk) Stats() DiskStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// CutAfterFlushBurst arranges for the power to go then (>= 1) writes or
// flushes after the disk first sees burst flushes in a row with no write
// between them: the mark of fsyncs of files that are already durable,
// such as a publish makes of the files it verified. CutAt cancels it.
func (d *Disk) CutAfterFlushBurst(burst, then int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cutAt, d.burst, d.then = 0, burst, max(1, then)
}

// arrive counts a write or flush and tells whether the power is still on
// for it. With d.mu held.
func (d *Disk) arrive(flush bool) bool {
	if d.dead {
		return false
	}
	d.events++
	if flush {
		d.flushRun++
	} else {
		d.flushRun = 0
	}
	if d.burst > 0 && d.flushRun >= d.burst {
		d.cutAt, d.burst = d.events+d.then, 0
	}
	if len(d.trace) < 100000 {
		d.trace = append(d.trace, "")
	}
	if d.cutAt > 0 && d.events >= d.cutAt {
		if len(d.trace) > 0 {
			d.trace[len(d.trace)-1] = "CUT"
		}
		d.dead = true
		close(d.cut)
		return false
	}
	return true
}

func (d *Disk) inRange(off int64, n int) error {
	if off < 0 || n < 0 || off > d.size || int64(n) > d.size-off {
		return fmt.Errorf("disk: %d bytes at %d are outside the disk's %d", n, off, d.size)
	}
	return nil
}

// ReadAt reads what the guest would see: the cache over the medium.
func (d *Disk) ReadAt(p []byte, off int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return ErrPowerLost
	}
	return d.readAt(p, off)
}

func (d *Disk) readAt(p []byte, off int64) error {
	if err := d.inRange(off, len(p)); err != nil {
		return err
	}
	if _, err := d.file.ReadAt(p, off); err != nil {
		return fmt.Errorf("disk: read: %w", err)
	}
	if len(d.latest) == 0 {
		return nil
	}
	for s := off / SectorSize; s*SectorSize < off+int64(len(p)); s++ {
		e, ok := d.latest[s]
		if !ok {
			continue
		}
		lo, hi := max(s*SectorSize, off), min((s+1)*SectorSize, off+int64(len(p)))
		copy(p[lo-off:hi-off], e.data[lo-e.off:hi-e.off])
	}
	return nil
}

// WriteAt puts a write in the cache. A write that does not cover whole
// sectors is widened to them with what the guest would read there, so the
// cache holds sectors only.
func (d *Disk) WriteAt(p []byte, off int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.arrive(false) {
		return ErrPowerLost
	}
	if err := d.inRange(off, len(p)); err != nil {
		return err
	}
	d.stats.Writes++
	if len(d.trace) > 0 {
		d.trace[len(d.trace)-1] = fmt.Sprintf("W%d+%d", off/SectorSize, len(p)/SectorSize)
	}
	d.stats.WrittenBytes += int64(len(p))
	if len(p) == 0 {
		return nil
	}
	start := off / SectorSize * SectorSize
	end := (off + int64(len(p)) + SectorSize - 1) / SectorSize * SectorSize
	data := make([]byte, end-start)
	if start != off || end != off+int64(len(p)) {
		if err := d.readAt(data, start); err != nil {
			return err
		}
	}
	copy(data[off-start:], p)
	e := &extent{off: start, data: data}
	d.pending = append(d.pending, e)
	d.bytes += int64(len(data))
	for s := start / SectorSize; s < end/SectorSize; s++ {
		d.latest[s] = e
	}
	for d.bytes > maxPendingBytes {
		if err := d.writeBackOldest(); err != nil {
			return err
		}
		d.stats.WrittenBack++
	}
	return nil
}

// Trim lets the disk forget a range; keeping it is allowed (reads after a
// trim may return the old data), so nothing changes.
func (d *Disk) Trim(off, n int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return ErrPowerLost
	}
	if off < 0 || n < 0 || off > d.size || n > d.size-off {
		return fmt.Errorf("disk: trim of %d bytes at %d outside the disk's %d", n, off, d.size)
	}
	return nil
}

// Flush makes every write that arrived before it durable.
func (d *Disk) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.arrive(true) {
		return ErrPowerLost
	}
	d.stats.Flushes++
	if len(d.trace) > 0 {
		d.trace[len(d.trace)-1] = "F"
	}
	for len(d.pending) > 0 {
		if err := d.writeBackOldest(); err != nil {
			return err
		}
	}
	return nil
}

func (d *Disk) writeBackOldest() error {
	e := d.pending[0]
	if _, err := d.file.WriteAt(e.data, e.off); err != nil {
		return fmt.Errorf("disk: write back: %w", err)
	}
	d.pending[0] = nil
	d.pending = d.pending[1:]
	d.bytes -= int64(len(e.data))
	for s := e.off / SectorSize; s < (e.off+int64(len(e.data)))/SectorSize; s++ {
		if d.latest[s] == e {
			delete(d.latest, s)
		}
	}
	return nil
}

// CrashMode says what of a disk's volatile cache survives a power loss.
type CrashMode int

const (
	// LoseAll: every write since the last flush is lost.
	LoseAll CrashMode = iota
	// KeepSome: a random subset of them survives, in any order, and a
	// surviving write may be torn (only some of its sectors survive), as
	// a disk that wrote back part of its cache in its own order leaves it.
	KeepSome
	// KeepAll: every write survives (a disk whose capacitors held up, or
	// a crash of the guest alone).
	KeepAll
)

func (m CrashMode) String() string {
	switch m {
	case LoseAll:
		return "lose-all"
	case KeepSome:
		return "keep-some"
	case KeepAll:
		return "keep-all"
	}
	return fmt.Sprintf("CrashMode(%d)", int(m))
}

// LossStats says what a power loss did to the volatile cache.
type LossStats struct {
	Mode CrashMode
	// Pending writes were in the cache; Kept of them survived whole, Torn
	// in part, the others not at all.
	Pending, Kept, Torn int
	// LostSectors counts the sectors that did not reach the medium.
	LostSectors int
}

// survivors decides, for each pending write (given as its sector count),
// which of its sectors reach the medium. The writes that survive are
// applied in arrival order, so where two overlap the later one wins.
func survivors(sectors []int, mode CrashMode, rng *rand.Rand) (keep [][]bool, st LossStats) {
	st.Mode, st.Pending = mode, len(sectors)
	keepWrite := 0.0
	switch mode {
	case KeepAll:
		keepWrite = 1
	case KeepSome:
		keepWrite = rng.Float64()
	}
	keep = make([][]bool, len(sectors))
	for i, n := range sectors {
		keep[i] = make([]bool, n)
		if rng.Float64() >= keepWrite && mode != KeepAll {
			st.LostSectors += n
			continue
		}
		torn := mode == KeepSome && n > 1 && rng.IntN(2) == 0
		kept := 0
		for j := range keep[i] {
			keep[i][j] = !torn || rng.IntN(2) == 0
			if keep[i][j] {
				kept++
			}
		}
		st.LostSectors += n - kept
		switch {
		case kept == n:
			st.Kept++
		case kept > 0:
			st.Torn++
		}
	}
	return keep, st
}

// PowerLoss ends the disk: what survives of the cache (as mode and rng
// decide) is written to the medium, the rest is dropped, and the file is
// closed. Call it after the guest is gone.
func (d *Disk) PowerLoss(mode CrashMode, rng *rand.Rand) (LossStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return LossStats{}, errors.New("disk: power loss after close")
	}
	d.dead = true
	sectors := make([]int, len(d.pending))
	for i, e := range d.pending {
		sectors[i] = len(e.data) / SectorSize
	}
	keep, st := survivors(sectors, mode, rng)
	var errs []error
	for i, e := range d.pending {
		for j, k := range keep[i] {
			if !k {
				continue
			}
			if _, err := d.file.WriteAt(e.data[j*SectorSize:(j+1)*SectorSize], e.off+int64(j)*SectorSize); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	d.pending, d.latest, d.bytes = nil, map[int64]*extent{}, 0
	d.closed = true
	errs = append(errs, d.file.Close())
	if err := errors.Join(errs...); err != nil {
		return st, fmt.Errorf("disk: power loss: %w", err)
	}
	return st, nil
}

// Close flushes the cache to the medium and closes it: a clean shutdown.
func (d *Disk) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed, d.dead = true, true
	var err error
	for len(d.pending) > 0 && err == nil {
		err = d.writeBackOldest()
	}
	return errors.Join(err, d.file.Close())
}
