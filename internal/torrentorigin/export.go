package torrentorigin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/anacrolix/torrent/bencode"
	"github.com/anacrolix/torrent/metainfo"

	"github.com/warmfleet/warmfleet/internal/s3origin"
)

// ExportOptions shape the .torrent Export writes.
type ExportOptions struct {
	// Name is the torrent's name: its top folder (BEP 3).
	Name string
	// WebSeeds are BEP 19 URLs: one ending in '/' serves file PATH at
	// URL + Name + "/" + PATH.
	WebSeeds []string
	// PieceLength is the piece size; 0 picks one (PieceLengthFor).
	PieceLength int64
	// CreatedBy goes in the "created by" field.
	CreatedBy string
}

// PieceLengthFor picks a piece length for total bytes: a power of two
// from 256 KiB to 16 MiB making at most ~2000 pieces, the sizes common
// clients pick, so a model of a few GB has pieces of a few MiB and a
// .torrent of tens of KB.
func PieceLengthFor(total int64) int64 {
	pl := int64(256 << 10)
	for pl < 16<<20 && total/pl > 2000 {
		pl *= 2
	}
	return pl
}

// Export builds a v1 .torrent of the files at paths (slash-separated,
// relative to dir) in that order, hashing their bytes: what any BitTorrent
// client reads.
func Export(ctx context.Context, dir string, paths []string, opts ExportOptions) (*metainfo.MetaInfo, error) {
	if err := s3origin.ValidRelPath(opts.Name); err != nil || strings.Contains(opts.Name, "/") {
		return nil, fmt.Errorf("torrent name %q: want a safe name without '/'", opts.Name)
	}
	if len(paths) == 0 {
		return nil, errors.New("export: no files")
	}
	for _, ws := range opts.WebSeeds {
		if u, err := url.Parse(ws); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("web seed %q: want an http(s) URL", ws)
		}
	}
	info := metainfo.Info{Name: opts.Name}
	var total int64
	for _, p := range paths {
		if err := s3origin.ValidRelPath(p); err != nil {
			return nil, fmt.Errorf("export %s: %w", p, err)
		}
		fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("export %s: not a regular file", p)
		}
		info.Files = append(info.Files, metainfo.FileInfo{Path: strings.Split(p, "/"), Length: fi.Size()})
		total += fi.Size()
	}
	if total == 0 {
		return nil, errors.New("export: the files hold no bytes")
	}
	info.PieceLength = opts.PieceLength
	if info.PieceLength == 0 {
		info.PieceLength = PieceLengthFor(total)
	}
	if info.PieceLength < MinPieceLength || info.PieceLength > MaxPieceLength {
		return nil, fmt.Errorf("piece length %d: want %d..%d", info.PieceLength, MinPieceLength, MaxPieceLength)
	}
	r := &filesReader{ctx: ctx, dir: dir, files: info.Files}
	defer r.close()
	pieces, err := metainfo.GeneratePieces(r, info.PieceLength, nil)
	if err != nil {
		return nil, fmt.Errorf("export: hash the files: %w", err)
	}
	if r.read != total {
		return nil, fmt.Errorf("export: read %d bytes, the files held %d when listed: did they change?", r.read, total)
	}
	info.Pieces = pieces
	mi := &metainfo.MetaInfo{CreatedBy: opts.CreatedBy, UrlList: opts.WebSeeds}
	if mi.InfoBytes, err = bencode.Marshal(info); err != nil {
		return nil, err
	}
	return mi, nil
}

// filesReader reads files one after another, each up to its listed length.
type filesReader struct {
	ctx   context.Context
	dir   string
	files []metainfo.FileInfo
	cur   io.Reader
	f     *os.File
	read  int64
}

func (r *filesReader) Read(p []byte) (int, error) {
	for {
		if err := r.ctx.Err(); err != nil {
			return 0, err
		}
		if r.cur == nil {
			if len(r.files) == 0 {
				return 0, io.EOF
			}
			fi := r.files[0]
			r.files = r.files[1:]
			f, err := os.Open(filepath.Join(r.dir, filepath.Join(fi.Path...)))
			if err != nil {
				return 0, err
			}
			r.f, r.cur = f, io.LimitReader(f, fi.Length)
		}
		n, err := r.cur.Read(p)
		r.read += int64(n)
		if errors.Is(err, io.EOF) {
			r.close()
			r.cur = nil
			err = nil
		}
		if n > 0 || err != nil {
			return n, err
		}
	}
}

func (r *filesReader) close() {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
}
