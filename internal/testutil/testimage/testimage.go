// Package testimage builds OCI images of seeded random (incompressible) data
// and pushes them to a registry, so image tests and benchmarks need nothing
// from the internet. The same Spec always yields the same digest; another
// Seed yields another one.
package testimage

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Spec describes an image.
type Spec struct {
	// Layers is the number of layers (at least 1).
	Layers int
	// Size is the total number of file bytes across all layers; each layer
	// holds one file of Size/Layers bytes (the first takes the remainder).
	Size int64
	// Seed selects the data.
	Seed uint64
}

// Build returns the image described by spec: a linux image for this
// machine's architecture whose layers are uncompressed tars (random data
// does not compress, and gzip would only cost CPU on both ends). Building
// reads every layer once to hash it; nothing is kept in memory.
func Build(spec Spec) (v1.Image, error) {
	if spec.Layers < 1 || spec.Layers > 1000 {
		return nil, fmt.Errorf("testimage: %d layers, want 1..1000", spec.Layers)
	}
	if spec.Size < 0 {
		return nil, fmt.Errorf("testimage: negative size %d", spec.Size)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Config:       v1.Config{Labels: map[string]string{"io.warmfleet.testimage.seed": fmt.Sprint(spec.Seed)}},
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, fmt.Errorf("testimage: config: %w", err)
	}
	layers := make([]v1.Layer, spec.Layers)
	per := spec.Size / int64(spec.Layers)
	for i := range layers {
		n := per
		if i == 0 {
			n += spec.Size % int64(spec.Layers)
		}
		l, err := newRandomLayer(spec.Seed, i, n)
		if err != nil {
			return nil, err
		}
		layers[i] = l
	}
	img, err = mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, fmt.Errorf("testimage: append layers: %w", err)
	}
	return img, nil
}

// Auth is the registry account to push with; empty means anonymous.
type Auth struct {
	Username, Password string
}

// Push uploads img to ref over plain HTTP (the test registries listen on
// loopback without TLS) and returns the manifest digest ("sha256:...").
func Push(ctx context.Context, ref string, img v1.Image, auth Auth) (string, error) {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return "", fmt.Errorf("testimage: reference %q: %w", ref, err)
	}
	a := authn.Anonymous
	if auth.Username != "" {
		a = &authn.Basic{Username: auth.Username, Password: auth.Password}
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuth(a)); err != nil {
		return "", fmt.Errorf("testimage: push %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("testimage: digest: %w", err)
	}
	return d.String(), nil
}

// BuildAndPush is Build then Push.
func BuildAndPush(ctx context.Context, ref string, spec Spec, auth Auth) (string, error) {
	img, err := Build(spec)
	if err != nil {
		return "", err
	}
	return Push(ctx, ref, img, auth)
}

// randomLayer is an uncompressed tar holding one file of seeded random
// bytes. Its stream is regenerated on every read, so a 512 MiB image costs
// no memory.
type randomLayer struct {
	seed     uint64
	index    int
	fileSize int64
	size     int64
	digest   v1.Hash
}

func newRandomLayer(seed uint64, index int, fileSize int64) (*randomLayer, error) {
	l := &randomLayer{seed: seed, index: index, fileSize: fileSize}
	rc := l.open()
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(h, rc)
	if err != nil {
		return nil, fmt.Errorf("testimage: hash layer %d: %w", index, err)
	}
	l.size = n
	l.digest = v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))}
	return l, nil
}

func (l *randomLayer) open() io.ReadCloser {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(l.write(pw)) }()
	return pr
}

func (l *randomLayer) write(w io.Writer) error {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[0:], l.seed)
	binary.LittleEndian.PutUint64(key[8:], uint64(l.index))
	src := rand.NewChaCha8(key)
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     fmt.Sprintf("warmfleet-layer-%03d.bin", l.index),
		Mode:     0o644,
		Size:     l.fileSize,
		Format:   tar.FormatPAX,
	}); err != nil {
		return err
	}
	if n, err := io.CopyN(tw, src, l.fileSize); err != nil {
		return fmt.Errorf("wrote %d of %d bytes: %w", n, l.fileSize, err)
	}
	return tw.Close()
}

func (l *randomLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *randomLayer) DiffID() (v1.Hash, error)             { return l.digest, nil }
func (l *randomLayer) Compressed() (io.ReadCloser, error)   { return l.open(), nil }
func (l *randomLayer) Uncompressed() (io.ReadCloser, error) { return l.open(), nil }
func (l *randomLayer) Size() (int64, error)                 { return l.size, nil }
func (l *randomLayer) MediaType() (types.MediaType, error) {
	return types.OCIUncompressedLayer, nil
}

// LayerDigests lists the digests of img's layers, in order.
func LayerDigests(img v1.Image) ([]string, error) {
	ls, err := img.Layers()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ls))
	for i, l := range ls {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		out[i] = d.String()
	}
	return out, nil
}
