package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Image is the answer of /image: what containerd holds of one image, read
// through its own content store, every blob hashed.
type Image struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
	// Updated is when containerd last wrote the image's record.
	Updated time.Time `json:"updated"`
	// Blobs and Bytes count the blobs read (index or manifest, config,
	// layers) and their bytes.
	Blobs int   `json:"blobs"`
	Bytes int64 `json:"bytes"`
	// Problems lists every blob that is missing, short or whose content
	// does not hash to its digest; empty when the image is complete.
	Problems []string `json:"problems"`
	// Unpacked is containerd's word that the layers are in the
	// snapshotter.
	Unpacked bool `json:"unpacked"`
}

// ContainerdSocket is where the guest's containerd listens.
const ContainerdSocket = "/run/containerd/containerd.sock"

// checkImage reads the image ref of namespace ns from the guest's
// containerd and hashes every blob it needs for this platform;
// errdefs.ErrNotFound when containerd has no such image.
func checkImage(ctx context.Context, ns, ref, snapshotter string) (Image, error) {
	c, err := client.New(ContainerdSocket, client.WithDefaultNamespace(ns), client.WithTimeout(10*time.Second))
	if err != nil {
		return Image{}, fmt.Errorf("image: %w", err)
	}
	defer c.Close()
	img, err := c.ImageService().Get(ctx, ref)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", ref, err)
	}
	out := Image{Ref: ref, Digest: img.Target.Digest.String(), Updated: img.UpdatedAt, Problems: []string{}}
	cs := c.ContentStore()
	platform := platforms.Default()
	verify := images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		out.Blobs++
		n, err := verifyBlob(ctx, cs, desc)
		out.Bytes += n
		if err != nil {
			out.Problems = append(out.Problems, err.Error())
			return nil, images.ErrSkipDesc // its children cannot be read
		}
		return nil, nil
	})
	walk := images.Handlers(verify, images.FilterPlatforms(images.ChildrenHandler(cs), platform))
	if err := images.Walk(ctx, walk, img.Target); err != nil {
		out.Problems = append(out.Problems, "walk: "+err.Error())
	}
	if len(out.Problems) == 0 {
		if out.Unpacked, err = client.NewImageWithPlatform(c, img, platform).IsUnpacked(ctx, snapshotter); err != nil {
			out.Problems = append(out.Problems, "unpacked: "+err.Error())
		}
	}
	return out, nil
}

// verifyBlob reads desc's blob whole and compares its size and digest.
func verifyBlob(ctx context.Context, cs content.Store, desc ocispec.Descriptor) (int64, error) {
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", desc.MediaType, desc.Digest, err)
	}
	defer ra.Close()
	v := desc.Digest.Algorithm().Digester()
	n, err := io.Copy(v.Hash(), io.NewSectionReader(ra, 0, desc.Size))
	if err != nil {
		return n, fmt.Errorf("%s %s: read: %w", desc.MediaType, desc.Digest, err)
	}
	switch got := v.Digest(); {
	case ra.Size() != desc.Size:
		return n, fmt.Errorf("%s %s: %d bytes in the store, want %d", desc.MediaType, desc.Digest, ra.Size(), desc.Size)
	case got != desc.Digest:
		return n, fmt.Errorf("%s %s: content hashes to %s", desc.MediaType, desc.Digest, got)
	}
	return n, nil
}

// serveImage answers GET /image?ns=NS&ref=REF&snapshotter=S.
func serveImage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ns, ref, snap := q.Get("ns"), q.Get("ref"), q.Get("snapshotter")
	if ns == "" || ref == "" || snap == "" {
		http.Error(w, "image: want ns, ref and snapshotter", http.StatusBadRequest)
		return
	}
	if _, err := digest.Parse(ref); err == nil {
		http.Error(w, "image: ref is a digest, want a name", http.StatusBadRequest)
		return
	}
	img, err := checkImage(r.Context(), ns, ref, snap)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		http.Error(w, err.Error(), http.StatusNotFound)
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	default:
		writeJSON(w, img)
	}
}
