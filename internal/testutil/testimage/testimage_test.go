package testimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

func TestBuildIsDeterministicAndSeeded(t *testing.T) {
	digest := func(s Spec) string {
		t.Helper()
		img, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	a := digest(Spec{Layers: 3, Size: 100_000, Seed: 1})
	if b := digest(Spec{Layers: 3, Size: 100_000, Seed: 1}); a != b {
		t.Fatalf("same spec, digests %s and %s", a, b)
	}
	if c := digest(Spec{Layers: 3, Size: 100_000, Seed: 2}); a == c {
		t.Fatal("another seed gave the same digest")
	}
}

func TestBuildLayersHoldTheRequestedBytes(t *testing.T) {
	img, err := Build(Spec{Layers: 3, Size: 100_001, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 3 {
		t.Fatalf("%d layers, want 3", len(layers))
	}
	var total int64
	var first []byte
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Next(); err != io.EOF {
			t.Fatalf("layer %d: more than one entry (%v)", i, err)
		}
		rc.Close()
		total += h.Size
		if i == 0 {
			first = data
		} else if bytes.Equal(first[:len(data)], data) {
			t.Fatalf("layer %d repeats layer 0's data", i)
		}
	}
	if total != 100_001 {
		t.Fatalf("layers hold %d bytes, want 100001", total)
	}
	// Random data must not compress, or the benchmark measures gzip.
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(first); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len() < len(first) {
		t.Fatalf("layer data compresses from %d to %d bytes", len(first), buf.Len())
	}
}

func TestBuildRejectsBadSpecs(t *testing.T) {
	for _, s := range []Spec{{Layers: 0, Size: 1}, {Layers: 1001, Size: 1}, {Layers: 1, Size: -1}} {
		if _, err := Build(s); err == nil {
			t.Errorf("Build(%+v) succeeded", s)
		}
	}
}

func TestPushToRegistry(t *testing.T) {
	r := testenv.StartRegistryWithAuth(t, "bob", "pw")
	ref := r.Ref("warmfleet/test", "v1")
	img, err := Build(Spec{Layers: 2, Size: 64 << 10, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Push(t.Context(), ref, img, Auth{}); err == nil {
		t.Fatal("anonymous push to an auth registry succeeded")
	}
	d, err := Push(t.Context(), ref, img, Auth{Username: "bob", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodHead, "http://"+r.Addr+"/v2/warmfleet/test/manifests/v1", nil)
	req.SetBasicAuth("bob", "pw")
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Docker-Content-Digest"); got != d {
		t.Fatalf("registry has %q for v1 (status %d), pushed %s", got, resp.StatusCode, d)
	}
}
