// Package agent is the guest agent of the power-loss test's virtual
// machines (see integration/vm): the last step of the guest's init, it lets
// the host read the guest's disk the way a serving framework would,
// through the guest's own kernel and file system, without trusting the
// daemon's word.
//
// It answers on TCP (the host reaches it through a qemu host forward):
//
//	GET /ready            200 once the data disk is mounted (the agent starts after)
//	GET /hash?dir=PATH    the files below PATH (symlinks resolved), each with its
//	                      size and SHA-256, as JSON (Listing); 404 when PATH does not exist
//	GET /image?ns=NS&ref=REF&snapshotter=S
//	                      the image REF as the guest's containerd holds it (Image): every
//	                      blob read through its content store and hashed against its
//	                      digest, and whether it is unpacked; 404 when containerd has no
//	                      such image (only in a guest that runs containerd)
//
// Two binaries run it: integration/vm/guestagent (the test's, built with
// CGO_ENABLED=0 so that it runs in an initramfs that holds nothing but
// busybox) and warmfleet-lab's vm-agent command (bench chaos --vm-cuts).
package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// File is one file below a hashed directory.
type File struct {
	Path   string `json:"path"` // relative to the directory, slash-separated
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Listing is the answer of /hash.
type Listing struct {
	Dir   string `json:"dir"` // the directory, symlinks resolved
	Files []File `json:"files"`
}

// maxFiles bounds one listing: the test's models have a handful of files,
// so more means a bug to report, not memory to spend.
const maxFiles = 10000

// Serve answers on listen until the listener fails.
func Serve(listen string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /hash", func(w http.ResponseWriter, r *http.Request) {
		l, err := hashDir(r.URL.Query().Get("dir"))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			http.Error(w, err.Error(), http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			writeJSON(w, l)
		}
	})
	mux.HandleFunc("GET /image", serveImage)
	srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// hashDir lists and hashes every regular file below dir.
func hashDir(dir string) (Listing, error) {
	if !filepath.IsAbs(dir) {
		return Listing{}, fmt.Errorf("hash: dir %q is not absolute", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return Listing{}, fmt.Errorf("hash: %w", err)
	}
	l := Listing{Dir: real, Files: []File{}}
	err = filepath.WalkDir(real, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if len(l.Files) >= maxFiles {
			return fmt.Errorf("more than %d files", maxFiles)
		}
		rel, err := filepath.Rel(real, path)
		if err != nil {
			return err
		}
		f := File{Path: filepath.ToSlash(rel)}
		if !d.Type().IsRegular() {
			f.SHA256 = "not a regular file: " + d.Type().String()
		} else if f.Size, f.SHA256, err = hashFile(path); err != nil {
			return err
		}
		l.Files = append(l.Files, f)
		return nil
	})
	if err != nil {
		return Listing{}, fmt.Errorf("hash %s: %w", dir, err)
	}
	return l, nil
}

func hashFile(path string) (int64, string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer fh.Close()
	h := sha256.New()
	n, err := io.Copy(h, fh)
	if err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}
