package torrentorigin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/anacrolix/torrent/bencode"
	"github.com/anacrolix/torrent/metainfo"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/origin"
)

// Bounds on what a .torrent file or a peer's metadata may make us hold.
const (
	// MaxMetainfo caps a .torrent file: 1 TiB in 16 MiB pieces takes
	// 1.3 MB of hashes, in 256 KiB pieces 80 MB, which no model torrent
	// needs.
	MaxMetainfo = 32 << 20
	// MaxFiles caps the files of one torrent.
	MaxFiles = 100_000
	// MaxPieceLength caps a piece: every read waits for a whole piece.
	MaxPieceLength = 256 << 20
	// MinPieceLength is BitTorrent's block size: smaller pieces are
	// not worth a hash each and no client makes them.
	MinPieceLength = 16 << 10
)

// layout is what the origin knows of a torrent once it holds its info:
// its files in torrent order with their offsets (v1 layout, padding files
// included, so piece indexes line up) and its piece hashes.
type layout struct {
	infoHash    string // 40 lower-case hex digits
	name        string
	pieceLength int64
	total       int64
	hashes      []byte // 20 bytes a piece
	files       []span
	infoBytes   []byte
}

// span is one file of a torrent.
type span struct {
	index   int
	key     string // the file's path in the torrent, under its name
	path    string // the file's path relative to the torrent's top folder
	off     int64  // offset in the torrent's byte stream
	length  int64
	padding bool // a BEP 47 padding file: zeros no one lists
}

// pieces is the number of pieces of l.
func (l *layout) pieces() int { return len(l.hashes) / 20 }

// pieceRange is the torrent offset and length of piece i.
func (l *layout) pieceRange(i int) (off, n int64) {
	off = int64(i) * l.pieceLength
	return off, min(l.pieceLength, l.total-off)
}

// file returns the span obj names, checking that obj is of this torrent.
func (l *layout) file(obj origin.Object) (span, error) {
	if obj.VersionID != l.infoHash {
		return span{}, fmt.Errorf("%s: %w: listed from torrent %s, this is %s", obj.Key, origin.ErrSourceChanged, obj.VersionID, l.infoHash)
	}
	for _, f := range l.files {
		if f.key == obj.Key && !f.padding {
			if f.length != obj.Size {
				return span{}, fmt.Errorf("%s: %w: %d bytes listed, the torrent says %d", obj.Key, origin.ErrSourceChanged, obj.Size, f.length)
			}
			return f, nil
		}
	}
	return span{}, fmt.Errorf("%s: %w in torrent %s", obj.Key, origin.ErrNotFound, l.infoHash)
}

// objects lists l's files, padding left out, as origin objects pinned to
// the info hash: a torrent is immutable, so the info hash is its revision.
func (l *layout) objects() []origin.Object {
	var out []origin.Object
	for _, f := range l.files {
		if f.padding {
			continue
		}
		out = append(out, origin.Object{
			Bucket: l.infoHash, Key: f.key, Path: f.path, Size: f.length,
			ETag: l.infoHash + "-" + strconv.Itoa(f.index), VersionID: l.infoHash,
		})
	}
	return out
}

// ParseMetainfo reads a .torrent file (at most MaxMetainfo bytes) and
// checks it: see checkInfo.
func ParseMetainfo(r io.Reader) (*metainfo.MetaInfo, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxMetainfo+1))
	if err != nil {
		return nil, fmt.Errorf("read .torrent: %w", err)
	}
	if len(b) > MaxMetainfo {
		return nil, fmt.Errorf("%w: .torrent larger than %d bytes", origin.ErrServer, MaxMetainfo)
	}
	var mi metainfo.MetaInfo
	if err := bencode.Unmarshal(b, &mi); err != nil {
		return nil, fmt.Errorf("not a .torrent file (bencode: %v)", err)
	}
	if len(mi.InfoBytes) == 0 {
		return nil, errors.New("not a .torrent file: no info dictionary")
	}
	if _, err := parseInfo(mi.InfoBytes); err != nil {
		return nil, err
	}
	return &mi, nil
}

// parseInfo decodes and checks an info dictionary (from a .torrent file or
// from peers, which anacrolix checked against the info hash already):
// a v1 (or hybrid) torrent, piece length in MinPieceLength..MaxPieceLength,
// one hash per piece, at most MaxFiles files, every path safe to write
// under the cache (s3origin.ValidRelPath), none twice.
func parseInfo(infoBytes []byte) (*layout, error) {
	var info metainfo.Info
	if err := bencode.Unmarshal(infoBytes, &info); err != nil {
		return nil, fmt.Errorf("torrent info: %v", err)
	}
	bad := func(format string, args ...any) (*layout, error) {
		return nil, fmt.Errorf("torrent %q: %s", info.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case !info.HasV1() || len(info.Pieces) == 0:
		return bad("no v1 piece hashes (a v2-only torrent): want a v1 or hybrid torrent")
	case info.PieceLength < MinPieceLength || info.PieceLength > MaxPieceLength:
		return bad("piece length %d: want %d..%d", info.PieceLength, MinPieceLength, MaxPieceLength)
	case len(info.Pieces)%20 != 0:
		return bad("piece hashes of %d bytes: not a multiple of 20", len(info.Pieces))
	case len(info.Files) > MaxFiles:
		return bad("%d files, at most %d", len(info.Files), MaxFiles)
	case len(info.Files) > 0 && info.Length != 0:
		return bad("both a length and a file list")
	}
	if err := s3origin.ValidRelPath(info.Name); err != nil || strings.Contains(info.Name, "/") {
		return bad("name is not a safe file or folder name: %v", cmpErr(err, "has a '/'"))
	}
	l := &layout{name: info.Name, pieceLength: info.PieceLength, hashes: info.Pieces, infoBytes: infoBytes}
	l.infoHash = metainfo.HashBytes(infoBytes).HexString()
	seen := map[string]bool{}
	i := 0
	for fi := range info.UpvertedV1Files() {
		if fi.Length < 0 || fi.Length > 1<<50 {
			return bad("file %d: length %d", i, fi.Length)
		}
		s := span{index: i, off: l.total, length: fi.Length, padding: strings.Contains(fi.Attr, "p")}
		if len(info.Files) == 0 {
			s.key, s.path = info.Name, info.Name
		} else {
			s.path = strings.Join(fi.BestPath(), "/")
			s.key = info.Name + "/" + s.path
		}
		if !s.padding {
			if err := s3origin.ValidRelPath(s.path); err != nil {
				return nil, fmt.Errorf("torrent %q: file %q: %w", info.Name, s.path, err)
			}
			if seen[s.path] {
				return bad("file %q listed twice", s.path)
			}
			seen[s.path] = true
		}
		l.files = append(l.files, s)
		l.total += fi.Length
		i++
	}
	if l.total == 0 {
		return bad("no bytes")
	}
	if want := (l.total + l.pieceLength - 1) / l.pieceLength; int64(l.pieces()) != want {
		return bad("%d piece hashes for %d bytes in pieces of %d: want %d", l.pieces(), l.total, l.pieceLength, want)
	}
	return l, nil
}

func cmpErr(err error, otherwise string) string {
	if err != nil {
		return err.Error()
	}
	return otherwise
}

// encodeMeta is a .torrent file holding infoBytes (and nothing the
// origin does not use): how a magnet's metadata is kept on disk.
func encodeMeta(infoBytes []byte) ([]byte, error) {
	var buf bytes.Buffer
	err := bencode.NewEncoder(&buf).Encode(metainfo.MetaInfo{InfoBytes: infoBytes})
	return buf.Bytes(), err
}
