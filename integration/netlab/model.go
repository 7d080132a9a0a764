package netlab

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// Model is a set of files seeded into the lab's S3 server, or served by
// another origin (URL).
type Model struct {
	Bucket string
	Prefix string // ends with "/"
	Files  []ModelFile
	// URL, if set, is the model's source in place of its s3:// one: an
	// hf:// model on a Hub a test or benchmark runs, say.
	URL string
}

// ModelFile is one object of a Model.
type ModelFile struct {
	Name   string // relative to Prefix
	Size   int64
	SHA256 string // hex
}

// Source is the model's s3:// URL for `warmfleet cache add --source`.
func (m Model) Source() string {
	if m.URL != "" {
		return m.URL
	}
	return "s3://" + m.Bucket + "/" + m.Prefix
}

// Size is the sum of the file sizes.
func (m Model) Size() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// SeedModel creates bucket (if needed) and uploads files objects named
// prefix + "model-0000N.safetensors" of pseudo-random bytes (from seed)
// totalling size bytes, spread as evenly as possible. Bytes do not compress
// and do not repeat across files, like real weights.
func (s *S3Host) SeedModel(ctx context.Context, bucket, prefix string, files int, size int64, seed uint64) (Model, error) {
	if files < 1 || size < int64(files) {
		return Model{}, fmt.Errorf("seed model: %d files of %d bytes in total: want at least one byte per file", files, size)
	}
	if err := s.MakeBucket(ctx, bucket); err != nil && !bucketExists(err) {
		return Model{}, fmt.Errorf("seed model: %w", err)
	}
	m := Model{Bucket: bucket, Prefix: prefix}
	for i, n := range fileSizes(files, size) {
		name := modelFileName(i)
		h := sha256.New()
		r := io.TeeReader(io.LimitReader(randomReader(seed, uint64(i)), n), h)
		if err := s.Put(ctx, bucket, prefix+name, r, n); err != nil {
			return Model{}, fmt.Errorf("seed model: %w", err)
		}
		m.Files = append(m.Files, ModelFile{Name: name, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))})
	}
	return m, nil
}

// ModelData makes in memory the files SeedModel uploads (same names,
// sizes and bytes for the same seed), for an origin that serves from
// memory, such as a Hub: the Model (without bucket or URL) and each file's
// bytes by name.
func ModelData(files int, size int64, seed uint64) (Model, map[string][]byte, error) {
	if files < 1 || size < int64(files) {
		return Model{}, nil, fmt.Errorf("model data: %d files of %d bytes in total: want at least one byte per file", files, size)
	}
	var m Model
	data := map[string][]byte{}
	for i, n := range fileSizes(files, size) {
		b := make([]byte, n)
		if _, err := io.ReadFull(randomReader(seed, uint64(i)), b); err != nil {
			return Model{}, nil, err
		}
		sum := sha256.Sum256(b)
		m.Files = append(m.Files, ModelFile{Name: modelFileName(i), Size: n, SHA256: hex.EncodeToString(sum[:])})
		data[modelFileName(i)] = b
	}
	return m, data, nil
}

// fileSizes spreads size bytes over files as evenly as possible.
func fileSizes(files int, size int64) []int64 {
	sizes := make([]int64, files)
	for i := range sizes {
		sizes[i] = size / int64(files)
		if int64(i) < size%int64(files) {
			sizes[i]++
		}
	}
	return sizes
}

func modelFileName(i int) string { return fmt.Sprintf("model-%05d.safetensors", i+1) }

// Verify checks that dir holds every file of the model with the right
// size and digest.
func (m Model) Verify(dir string) error {
	for _, f := range m.Files {
		fh, err := os.Open(filepath.Join(dir, f.Name))
		if err != nil {
			return fmt.Errorf("verify model: %w", err)
		}
		h := sha256.New()
		n, err := io.Copy(h, fh)
		_ = fh.Close()
		if err != nil {
			return fmt.Errorf("verify model: %s: %w", f.Name, err)
		}
		if n != f.Size || hex.EncodeToString(h.Sum(nil)) != f.SHA256 {
			return fmt.Errorf("verify model: %s: %d bytes with sha256 %x, want %d bytes with %s", f.Name, n, h.Sum(nil), f.Size, f.SHA256)
		}
	}
	return nil
}

// randomReader returns a fast deterministic stream for (seed, stream).
func randomReader(seed, stream uint64) io.Reader {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[0:], seed)
	binary.LittleEndian.PutUint64(key[8:], stream)
	return rand.NewChaCha8(key)
}

func bucketExists(err error) bool {
	var owned *types.BucketAlreadyOwnedByYou
	var exists *types.BucketAlreadyExists
	return errors.As(err, &owned) || errors.As(err, &exists)
}
