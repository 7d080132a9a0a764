package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Shard is a shard opened on a node: its file, which pieces are verified,
// and the downloaders subscribed to it. Verified pieces are served to peers
// until Close.
//
// A shard may be open before its manifest is complete (OpenPartial): its
// origin learns each piece hash as it reads the piece from S3, and peers
// learn it with the piece's have notice, so pieces flow to the fleet while
// the origin is still reading the rest. Every piece is still verified
// against its hash before it counts as present.
type Shard struct {
	n    *Node
	m    *Manifest // Hashes filled in under mu as they become known
	skel [32]byte  // the manifest's SkeletonID: what peers subscribe to
	key  string    // completion key
	path string
	comp Completion

	fileMu sync.RWMutex // readers: uploads and writes; writer: Close
	file   *os.File
	ino    uint64 // fileIdentity, kept in completion records

	mu       sync.Mutex
	known    Bitfield // piece hash known (a superset of have)
	have     Bitfield // verified: served and counted as present
	durable  Bitfield // verified and fdatasynced, as stored in comp
	subs     map[*serverConn]struct{}
	crcs     []uint64 // FetchOptions.PieceCRC of pieces verified in this process
	crcKnown Bitfield // which crcs are set
	closed   bool
	fetching bool
	running  *fetch        // the Fetch in progress, if any: what it knows of its peers is tests' to see
	fullCh   chan struct{} // closed when have is full
	// moved is closed and replaced whenever a twin following this shard
	// has something to look at: a piece verified, a fetch ended, Close.
	moved chan struct{}
}

// Open registers the shard described by m, whose bytes live in the file at
// path (at m.Offset; the file is created and sized to m.FileSize if needed),
// and starts serving the pieces comp records as complete. Completion is
// trusted without rehashing unless the file is too short to hold the shard.
// A shard ID already open at another path opens as a twin: it is served
// only once the first one closes, and its Fetch copies from it (see Fetch).
func (n *Node) Open(ctx context.Context, m *Manifest, path string, comp Completion) (*Shard, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	known := NewBitfield(m.NumPieces())
	for i := range m.NumPieces() {
		known.Set(i)
	}
	return n.open(m.clone(), known, path, comp)
}

// OpenPartial registers a shard whose piece hashes are not known yet (m's
// Hashes are ignored): the ones a previous run stored with its completion
// are restored, the others are learned from the origin (Fetch with an
// Origin computes them from what it reads) or from peers that hold the
// piece. The manifest is complete once the shard is.
func (n *Node) OpenPartial(ctx context.Context, m *Manifest, path string, comp Completion) (*Shard, error) {
	skel := m.clone()
	skel.Hashes = make([]byte, skel.NumPieces()*skel.Algo.Size())
	if err := skel.Validate(); err != nil {
		return nil, err
	}
	return n.open(skel, NewBitfield(skel.NumPieces()), path, comp)
}

func (n *Node) open(m *Manifest, known Bitfield, path string, comp Completion) (*Shard, error) {
	if comp == nil {
		return nil, errors.New("p2p: open: nil completion store")
	}
	f, ino, fresh, err := openShardFile(path, m)
	if err != nil {
		return nil, err
	}
	skel := m.SkeletonID()
	s := &Shard{n: n, m: m, skel: skel, key: completionKey(skel, ino), path: path, comp: comp, file: f, ino: ino,
		known: known, have: NewBitfield(m.NumPieces()), subs: map[*serverConn]struct{}{}, fullCh: make(chan struct{}), moved: make(chan struct{})}
	stored, err := comp.Load(s.key)
	if err == nil && stored == nil {
		// Written before keys named the file; its inode still has to match.
		stored, err = comp.Load(hex.EncodeToString(skel[:]))
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("p2p: open %s: %w", m.ShardID, err)
	}
	if stored != nil {
		rec, err := parseCompletion(stored, m)
		switch {
		case err != nil:
			n.log.Warn("p2p: ignoring corrupt completion record", "shard", m.ShardID, "err", err)
		case fresh || rec.ino != ino:
			// The file was recreated or cut short since the record was
			// written: its bytes are not the ones that were verified.
			n.log.Warn("p2p: file changed since completion was recorded, starting over", "shard", m.ShardID, "path", path)
		default:
			s.restore(rec)
		}
	}
	s.durable = s.have.Clone()
	if s.have.Full() {
		close(s.fullCh)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	primary := n.shards[m.ShardID]
	if primary == nil {
		n.shards[m.ShardID] = s
		close(n.opened)
		n.opened = make(chan struct{})
		return s, nil
	}
	// The same content under another name (two models with identical
	// files): the shard is swarmed once, by the shard opened first, and
	// this twin copies its pieces locally (see Fetch).
	for _, o := range append([]*Shard{primary}, n.twins[m.ShardID]...) {
		if o.path == path {
			f.Close()
			return nil, fmt.Errorf("p2p: shard %s already open at %s", m.ShardID, path)
		}
	}
	n.twins[m.ShardID] = append(n.twins[m.ShardID], s)
	return s, nil
}

// twinSource returns the shard s copies its pieces from: the one serving
// its ID on this node, when that is another file cut the same way. Nil
// when s is the one serving (it fetches from peers and origins itself).
func (n *Node) twinSource(s *Shard) *Shard {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.shards[s.m.ShardID]
	if p == nil || p == s || p.skel != s.skel {
		return nil
	}
	return p
}

// unregister forgets s; when s was the one serving its ID, a twin takes
// over, a complete one first, so peers keep being served the content.
func (n *Node) unregister(s *Shard) {
	n.mu.Lock()
	defer n.mu.Unlock()
	id := s.m.ShardID
	twins := slices.DeleteFunc(n.twins[id], func(t *Shard) bool { return t == s })
	if n.shards[id] == s {
		delete(n.shards, id)
		if len(twins) > 0 {
			k := max(0, slices.IndexFunc(twins, (*Shard).Complete))
			n.shards[id] = twins[k]
			twins = slices.Delete(twins, k, k+1)
		}
	}
	if len(twins) == 0 {
		delete(n.twins, id)
	} else {
		n.twins[id] = twins
	}
}

// completionKey names a shard's completion record: its skeleton and its
// file's identity, since twins (one shard ID open at several paths) each
// have one. The identity, not the path, because a shard is fetched in a
// staging directory and served from the published one after a rename,
// which keeps the file (and its record) the same.
func completionKey(skel [32]byte, ino uint64) string {
	return hex.EncodeToString(skel[:]) + "@" + strconv.FormatUint(ino, 16)
}

// restore adopts the verified pieces of a completion record: a piece
// counts only if its stored hash agrees with what the shard knows.
func (s *Shard) restore(rec completion) {
	size := s.m.Algo.Size()
	for i := range s.m.NumPieces() {
		if !rec.have.Has(i) {
			continue
		}
		h := rec.hashes[i*size : (i+1)*size]
		if s.known.Has(i) {
			if !bytes.Equal(h, s.m.PieceHash(i)) {
				continue
			}
		} else {
			copy(s.m.Hashes[i*size:], h)
			s.known.Set(i)
		}
		s.have.Set(i)
	}
}

// openShardFile opens (creating) the file and makes it exactly FileSize
// long. It returns the inode, which completion records carry so that a
// recreated file is not mistaken for the verified one, and whether the file
// had to be created or grown (then no stored completion can be trusted).
func openShardFile(path string, m *Manifest) (f *os.File, ino uint64, fresh bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, 0, false, fmt.Errorf("p2p: open %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, false, fmt.Errorf("p2p: stat %s: %w", path, err)
	}
	switch {
	case !st.Mode().IsRegular():
		f.Close()
		return nil, 0, false, fmt.Errorf("p2p: %s is not a regular file", path)
	case st.Size() > m.FileSize:
		f.Close()
		return nil, 0, false, fmt.Errorf("p2p: %s is %d bytes, manifest says %d", path, st.Size(), m.FileSize)
	case st.Size() < m.FileSize:
		if err := f.Truncate(m.FileSize); err != nil {
			f.Close()
			return nil, 0, false, fmt.Errorf("p2p: size %s: %w", path, err)
		}
		fresh = true
	}
	if err := preallocate(f, m.Offset, m.Length); err != nil {
		f.Close()
		return nil, 0, false, fmt.Errorf("p2p: reserve %d bytes of %s: %w", m.Length, path, err)
	}
	return f, fileIdentity(f, st), fresh, nil
}

// preallocate reserves the shard's blocks up front: a full disk then fails
// the open instead of a write halfway through, and the filesystem allocates
// one extent instead of block by block as pieces land. Filesystems without
// fallocate are fine.
func preallocate(f *os.File, off, n int64) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := sc.Control(func(fd uintptr) {
		ferr = unix.Fallocate(int(fd), unix.FALLOC_FL_KEEP_SIZE, off, n)
	}); err != nil {
		return err
	}
	if errors.Is(ferr, unix.EOPNOTSUPP) || errors.Is(ferr, unix.ENOSYS) {
		return nil
	}
	return ferr
}

// fileIdentity tells file instances apart: the inode number mixed with the
// birth time, because a deleted file's inode number is soon reused.
func fileIdentity(f *os.File, st os.FileInfo) uint64 {
	var id uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		id = sys.Ino
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return id
	}
	_ = sc.Control(func(fd uintptr) {
		var stx unix.Statx_t
		if unix.Statx(int(fd), "", unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_BTIME, &stx) == nil && stx.Mask&unix.STATX_BTIME != 0 {
			id = mix64(id ^ mix64(uint64(stx.Btime.Sec)*1e9+uint64(stx.Btime.Nsec)))
		}
	})
	return id
}

// A completion record is a magic, the file's identity, the bitfield of
// durable pieces and the hash of every piece (zero where unknown), so a
// shard opened before its manifest was complete resumes too.
var completionMagic = []byte("WFC2")

type completion struct {
	ino    uint64
	have   Bitfield
	hashes []byte
}

func completionRecord(ino uint64, bf Bitfield, hashes []byte) []byte {
	b := append([]byte{}, completionMagic...)
	b = binary.BigEndian.AppendUint64(b, ino)
	b = append(b, bf.b...)
	return append(b, hashes...)
}

func parseCompletion(b []byte, m *Manifest) (completion, error) {
	np := m.NumPieces()
	head := len(completionMagic) + 8
	bfLen := (np + 7) / 8
	if len(b) != head+bfLen+np*m.Algo.Size() || string(b[:len(completionMagic)]) != string(completionMagic) {
		return completion{}, errors.New("p2p: not a completion record for this shard")
	}
	bf, err := ParseBitfield(b[head:head+bfLen], np)
	if err != nil {
		return completion{}, err
	}
	return completion{ino: binary.BigEndian.Uint64(b[len(completionMagic):]), have: bf, hashes: b[head+bfLen:]}, nil
}

// Manifest returns the shard's manifest: a copy, complete once the shard
// is (before that, unknown piece hashes are zero).
func (s *Shard) Manifest() *Manifest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.clone()
}

// ShardID returns the shard's fleet-wide name.
func (s *Shard) ShardID() string { return s.m.ShardID }

// pieceHash returns the hash of piece i, or nil while it is unknown.
func (s *Shard) pieceHash(i int) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.known.Has(i) {
		return nil
	}
	return s.m.PieceHash(i)
}

// learn records the hash of piece i as told by a peer or computed from
// the origin's bytes. A different hash for a piece whose hash is known is an
// error: one of the two sources is lying or broken.
func (s *Shard) learn(i int, h []byte) error {
	if len(h) != s.m.Algo.Size() {
		return fmt.Errorf("%w: hash of %d bytes", errProtocol, len(h))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known.Has(i) {
		if !bytes.Equal(h, s.m.PieceHash(i)) {
			return fmt.Errorf("%w: conflicting hash for piece %d", errProtocol, i)
		}
		return nil
	}
	copy(s.m.Hashes[i*len(h):], h)
	s.known.Set(i)
	return nil
}

// Path returns the file holding the shard.
func (s *Shard) Path() string { return s.path }

// HoldsFileAt reports whether the file now at path is the one the shard
// holds open: not removed, replaced or recreated since it was opened.
func (s *Shard) HoldsFileAt(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	st, err := f.Stat()
	return err == nil && fileIdentity(f, st) == s.ino
}

// Have returns a copy of the set of verified pieces.
func (s *Shard) Have() Bitfield {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.have.Clone()
}

// Complete reports whether every piece is verified.
func (s *Shard) Complete() bool {
	select {
	case <-s.fullCh:
		return true
	default:
		return false
	}
}

// Close stops serving the shard and closes its file. Completion stays
// stored so a later Open resumes.
func (s *Shard) Close() error {
	s.n.unregister(s)
	s.mu.Lock()
	s.closed = true
	subs := s.subs
	s.subs = nil
	s.wakeTwinsLocked()
	s.mu.Unlock()
	for sc := range subs {
		sc.c.Close()
	}
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	if s.file == nil {
		return nil
	}
	err := s.file.Close()
	s.file = nil
	return err
}

// wakeTwinsLocked tells twins copying from s to look again. Call with
// s.mu held.
func (s *Shard) wakeTwinsLocked() {
	close(s.moved)
	s.moved = make(chan struct{})
}

func (s *Shard) subscribe(sc *serverConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	// The bitfield goes out under the lock so no have is sent before it or
	// lost. The hash of every piece held follows it, for a downloader whose
	// manifest is still partial.
	payload := s.have.Bytes()
	for i := range s.m.NumPieces() {
		if s.have.Has(i) {
			payload = append(payload, s.m.PieceHash(i)...)
		}
	}
	sc.wmu.Lock()
	_ = sc.c.SetWriteDeadline(s.n.cfg.Now().Add(s.n.cfg.DialTimeout))
	err := writeFrame(sc.c, msgBitfield, payload)
	_ = sc.c.SetWriteDeadline(time.Time{})
	sc.wmu.Unlock()
	if err != nil {
		return false
	}
	s.subs[sc] = struct{}{}
	return true
}

func (s *Shard) unsubscribe(sc *serverConn) {
	s.mu.Lock()
	delete(s.subs, sc)
	s.mu.Unlock()
}

// readFile returns the open file for serving verified piece i, or nil.
func (s *Shard) readFile(i int) (*os.File, func()) {
	s.mu.Lock()
	ok := s.have.Has(i)
	s.mu.Unlock()
	if !ok {
		return nil, nil
	}
	s.fileMu.RLock()
	if s.file == nil {
		s.fileMu.RUnlock()
		return nil, nil
	}
	return s.file, s.fileMu.RUnlock
}

// writeAt writes piece bytes; it fails once the shard is closed.
func (s *Shard) writeAt(b []byte, off int64) error {
	s.fileMu.RLock()
	defer s.fileMu.RUnlock()
	if s.file == nil {
		return errors.New("p2p: shard closed")
	}
	if _, err := s.file.WriteAt(b, off); err != nil {
		return fmt.Errorf("p2p: write %s: %w", s.path, err)
	}
	return nil
}

// Recheck hashes every piece not yet counted as present and counts the ones
// whose bytes match, then makes that durable. Use it to adopt a file written
// by something else (a plain S3 download) or after a crash of unknown
// extent; it reads the whole shard, so Open does not do it by itself.
func (s *Shard) Recheck(ctx context.Context) (found int, err error) {
	have := s.Have()
	buf := make([]byte, chunkSize)
	for i := range s.m.NumPieces() {
		if have.Has(i) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return found, err
		}
		off, n := s.m.PieceRange(i)
		h := s.m.Algo.new()
		err := s.withFile(func(file *os.File) error { return hashRead(h, file, off, n, buf) })
		if errors.Is(err, io.ErrUnexpectedEOF) {
			continue // the file ends inside the piece: not there
		}
		if err != nil {
			return found, fmt.Errorf("p2p: recheck %s: %w", s.path, err)
		}
		if want := s.pieceHash(i); want != nil && bytes.Equal(h.Sum(nil), want) {
			s.markVerified(i, nil)
			found++
		}
	}
	return found, s.Sync()
}

// markVerified records piece i as present and tells subscribers; crc is
// the piece's FetchOptions.PieceCRC when the fetch asked for one.
func (s *Shard) markVerified(i int, crc *uint64) {
	s.mu.Lock()
	if s.have.Has(i) {
		s.mu.Unlock()
		return
	}
	s.have.Set(i)
	if crc != nil {
		if s.crcs == nil {
			s.crcs, s.crcKnown = make([]uint64, s.m.NumPieces()), NewBitfield(s.m.NumPieces())
		}
		s.crcs[i] = *crc
		s.crcKnown.Set(i)
	}
	full := s.have.Full()
	h := bytes.Clone(s.m.PieceHash(i))
	for sc := range s.subs {
		sc.notify(i, h)
	}
	s.wakeTwinsLocked()
	s.mu.Unlock()
	s.n.c.verified.Add(1)
	if full {
		close(s.fullCh)
	}
}

// Subscribed reports whether the member named id follows this shard here:
// it hears of each piece this node gets as soon as it is in.
func (s *Shard) Subscribed(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sc := range s.subs {
		if sc.peer == id {
			return true
		}
	}
	return false
}

// PieceCRC is the FetchOptions.PieceCRC of a verified piece: Off is its
// offset in the file.
type PieceCRC struct {
	Off, Len int64
	CRC      uint64
}

// PieceCRCs returns the CRCs of the pieces verified with
// FetchOptions.PieceCRC set since the shard was opened; pieces restored
// from an earlier run, or verified without it, have none.
func (s *Shard) PieceCRCs() []PieceCRC {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []PieceCRC
	for i, crc := range s.crcs {
		if s.crcKnown.Has(i) {
			off, n := s.m.PieceRange(i)
			out = append(out, PieceCRC{Off: off, Len: n, CRC: crc})
		}
	}
	return out
}

// Sync makes every verified piece durable: fdatasync, then store the
// completion bitfield. Pieces verified after the sync started wait for the
// next one.
func (s *Shard) Sync() error {
	s.mu.Lock()
	snap := s.have.Clone()
	hashes := bytes.Clone(s.m.Hashes)
	same := string(snap.b) == string(s.durable.b)
	s.mu.Unlock()
	if same {
		return nil
	}
	s.fileMu.RLock()
	if s.file == nil {
		s.fileMu.RUnlock()
		return errors.New("p2p: shard closed")
	}
	err := fdatasync(s.file)
	s.fileMu.RUnlock()
	if err != nil {
		return fmt.Errorf("p2p: sync %s: %w", s.path, err)
	}
	if err := s.comp.Store(s.key, completionRecord(s.ino, snap, hashes)); err != nil {
		return err
	}
	s.mu.Lock()
	s.durable = snap
	s.mu.Unlock()
	return nil
}

func fdatasync(f *os.File) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := sc.Control(func(fd uintptr) {
		for {
			opErr = syscall.Fdatasync(int(fd))
			if opErr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return opErr
}
