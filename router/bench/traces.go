package bench

import (
	"compress/gzip"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// embeddedTraces are the Mooncake traces, gzip'ed, so the lab binary runs
// the trace workloads from any directory (traces/README.md has their source
// and licence).
//
//go:embed traces/*.jsonl.gz
var embeddedTraces embed.FS

// openTrace opens a trace file by name: from the embedded copies when dir
// is empty, else from dir, where the plain file wins over a .gz one.
func openTrace(dir, file string) (io.ReadCloser, error) {
	if dir == "" {
		f, err := embeddedTraces.Open("traces/" + file + ".gz")
		if err != nil {
			return nil, fmt.Errorf("embedded trace %s: %w", file, err)
		}
		return gunzip(f)
	}
	f, err := os.Open(filepath.Join(dir, file))
	if err == nil {
		return f, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	gz, gzErr := os.Open(filepath.Join(dir, file+".gz"))
	if gzErr != nil {
		return nil, err // the plain name is the one to report
	}
	return gunzip(gz)
}

// gunzip reads f through gzip; closing the result closes f.
func gunzip(f io.ReadCloser) (io.ReadCloser, error) {
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("gunzip: %w", err)
	}
	return gzipFile{zr, f}, nil
}

type gzipFile struct {
	*gzip.Reader
	f io.Closer
}

func (g gzipFile) Close() error { return errors.Join(g.Reader.Close(), g.f.Close()) }
