package imagecache

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestEnsureRefetchesBlobsWhoseFilesAreGone puts containerd in the state
// a power cut left in the power-loss test's virtual machine (integration/vm):
// its metadata DB records blobs whose files the content store lacks
// (containerd fsyncs a committed blob and its DB, not the directory it
// renames the blob into, so the rename can be lost while the record
// stays). Every pull then skipped those blobs' fetch and failed reading
// them, for ever, reported as "image not found in registry". Ensure must
// drop such records, fetch the blobs again and end with the image whole.
func TestEnsureRefetchesBlobsWhoseFilesAreGone(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref, dgst := e.push(t, "warmfleet/cut", "v1", 7)
	mustEnsure(t, e.cache, ref, "team-a")

	ctx := e.ctx(t)
	cs := e.client.ContentStore()
	img, err := e.client.ImageService().Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	mf, err := images.Manifest(ctx, cs, img.Target, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	blobs := append([]ocispec.Descriptor{img.Target, mf.Config}, mf.Layers...)
	// The manifest's and a layer's files go; their records stay.
	for _, d := range []digest.Digest{img.Target.Digest, mf.Layers[1].Digest} {
		e.removeBlobFile(t, d)
	}
	// What the cut's reboot does: the daemon ensures its claims again.
	st, err := e.cache.Ensure(t.Context(), ref, "team-a")
	if err != nil {
		t.Fatalf("ensure after the blobs' files were lost: %v", err)
	}
	if st.State != StateReady || st.Digest != dgst || !st.Unpacked {
		t.Fatalf("status %+v, want ready, unpacked, digest %s", st, dgst)
	}
	e.checkBlobs(t, blobs)

	// A layer's file alone goes, its record and the image's stay: the
	// image is unpacked, but not whole in containerd.
	e.removeBlobFile(t, mf.Layers[0].Digest)
	st, err = e.cache.Ensure(t.Context(), ref, "team-b")
	if err != nil || st.State != StateReady || !st.Unpacked {
		t.Fatalf("ensure after a layer's file was lost: %+v, %v", st, err)
	}
	e.checkBlobs(t, blobs)
}

func (e *env) removeBlobFile(t *testing.T, d digest.Digest) {
	t.Helper()
	path := filepath.Join(e.ctd.Root, "io.containerd.content.v1.content", "blobs", d.Algorithm().String(), d.Encoded())
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if !e.contentExists(t, d.String()) {
		t.Fatalf("%s: its record went with its file", d)
	}
}

// checkBlobs reads every blob through containerd and hashes it.
func (e *env) checkBlobs(t *testing.T, blobs []ocispec.Descriptor) {
	t.Helper()
	cs := e.client.ContentStore()
	for _, d := range blobs {
		ra, err := cs.ReaderAt(e.ctx(t), d)
		if err != nil {
			t.Errorf("%s after ensure: %v", d.Digest, err)
			continue
		}
		v := d.Digest.Algorithm().Digester()
		_, err = io.Copy(v.Hash(), content.NewReader(ra))
		ra.Close()
		if err != nil || v.Digest() != d.Digest {
			t.Errorf("%s after ensure: read %v, hashes to %s", d.Digest, err, v.Digest())
		}
	}
}

// TestListReportsAnImageWithoutItsBlobsIncomplete restarts the cache (a
// new Cache on the same containerd, as a daemon's start after a power
// cut) on an image whose record stayed while a layer's file went: List
// must not call it ready, and Ensure must make it whole again.
func TestListReportsAnImageWithoutItsBlobsIncomplete(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref, _ := e.push(t, "warmfleet/cut", "v1", 8)
	mustEnsure(t, e.cache, ref, "team-a")
	ctx := e.ctx(t)
	img, err := e.client.ImageService().Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	mf, err := images.Manifest(ctx, e.client.ContentStore(), img.Target, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	e.removeBlobFile(t, mf.Layers[1].Digest)

	restarted, err := New(e.client, Options{Namespace: testNS, Snapshotter: e.ctd.Snapshotter, HostsDir: writeHostsDir(t, e.reg.Addr), DisableECR: true})
	if err != nil {
		t.Fatal(err)
	}
	list, err := restarted.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].State != StateIncomplete || !strings.Contains(list[0].Error, mf.Layers[1].Digest.String()) {
		t.Fatalf("List after a layer's file went: %+v, want %s, naming %s", list, StateIncomplete, mf.Layers[1].Digest)
	}
	if st := mustEnsure(t, restarted, ref, "team-a"); st.State != StateReady {
		t.Fatalf("ensure: %+v, want ready", st)
	}
	e.checkBlobs(t, append([]ocispec.Descriptor{img.Target, mf.Config}, mf.Layers...))
}
