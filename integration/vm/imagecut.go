package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	mrand "math/rand/v2"

	imagecache "github.com/warmfleet/warmfleet/containerd"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/integration/vm/agent"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/testimage"
)

// The guest's containerd: its root and state on the data disk, so that a
// cut hits its metadata DB, content store and snapshots; the daemon's
// namespace (kubelet's, the daemon's default) and snapshotter (the image
// cache's default).
const (
	guestContainerdDir = DataDir + "/containerd"
	guestHostsDir      = "/etc/containerd/certs.d"
	imageNamespace     = "k8s.io"
	imageSnapshotter   = "overlayfs"
	imageOwner         = "vm"
)

// refetchLogs are the image cache's log messages (package containerd) of
// blobs containerd recorded but lost, fetched again.
var refetchLogs = []string{"blobs missing behind the pull", "image incomplete in containerd"}

// imageSpec is every pushed image's shape: layers of seeded random bytes,
// about a model's size, so that a pull takes about as many writes as the
// first one, which places the cuts.
func imageSpec(seed uint64) testimage.Spec {
	return testimage.Spec{Layers: 3, Size: 4<<20 + 12345, Seed: seed}
}

// withContainerd adds the guest's containerd to spec: its config, the
// shared libraries it loads, the registry's hosts.toml (plain HTTP) and
// the daemon's flags to use both.
func (r *run) withContainerd(ctx context.Context, spec *GuestSpec) error {
	if r.opts.Containerd == "" || r.opts.Registry == "" {
		return errors.New("power cuts: image cuts need a containerd binary and a registry")
	}
	libs, err := SharedLibs(ctx, r.opts.Containerd)
	if err != nil {
		return fmt.Errorf("power cuts: containerd: %w", err)
	}
	guestReg, err := r.guestRegistry()
	if err != nil {
		return err
	}
	spec.Libs = libs
	spec.ContainerdConfig = testenv.ContainerdConfig(guestContainerdDir+"/root", guestContainerdDir+"/state", GuestContainerdSocket)
	spec.Files[strings.TrimPrefix(guestHostsDir, "/")+"/"+guestReg+"/hosts.toml"] = fmt.Appendf(nil, "server = %q\n", "http://"+guestReg)
	args := slices.Clone(spec.DaemonArgs)
	i := slices.Index(args, "--containerd")
	args[i+1] = "unix://" + GuestContainerdSocket
	spec.DaemonArgs = append(args, "--registry-hosts-dir", guestHostsDir)
	return nil
}

// guestRegistry is the registry as the guest reaches it.
func (r *run) guestRegistry() (string, error) {
	_, port, err := net.SplitHostPort(r.opts.Registry)
	if err != nil {
		return "", fmt.Errorf("power cuts: registry %q: %w", r.opts.Registry, err)
	}
	return net.JoinHostPort(HostFromVM, port), nil
}

// images are the image pulls a run cuts: each an image of its own layers
// pushed to the host's registry, claimed through the daemon's API.
type images struct {
	r   *run
	all []sourceImage
}

// sourceImage is one pushed image: its name as the daemon and containerd
// know it, and its manifest's digest.
type sourceImage struct {
	ref, digest string
}

func (w *images) what() string       { return "pull" }
func (w *images) counts() *CutCounts { return &w.r.res.Images }

func (w *images) next(ctx context.Context, i int, rng *mrand.Rand) (string, error) {
	guestReg, err := w.r.guestRegistry()
	if err != nil {
		return "", err
	}
	repo := fmt.Sprintf("/vm/img%d:v1", i)
	dgst, err := testimage.BuildAndPush(ctx, w.r.opts.Registry+repo, imageSpec(rng.Uint64()), testimage.Auth{})
	if err != nil {
		return "", fmt.Errorf("power cuts: push image %d: %w", i, err)
	}
	ref, err := imagecache.NormalizeRef(guestReg + repo)
	if err != nil {
		return "", fmt.Errorf("power cuts: %w", err)
	}
	w.all = append(w.all, sourceImage{ref: ref, digest: dgst})
	return ref, nil
}

func (w *images) add(ctx context.Context, m *machine, ref string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := m.client.AddImage(ctx, api.AddImageRequest{Ref: ref, Owner: imageOwner}); err != nil {
		return fmt.Errorf("add image %s: %w\nconsole:\n%s", ref, err, tail(m.vm.Console(), 4000))
	}
	return nil
}

// status is what the daemon reports of ref; false when it lists nothing.
func status(ctx context.Context, m *machine, ref string) (api.ImageStatus, bool, error) {
	all, err := m.client.Images(ctx)
	if err != nil {
		return api.ImageStatus{}, false, err
	}
	i := slices.IndexFunc(all, func(st api.ImageStatus) bool { return st.Ref == ref })
	if i < 0 {
		return api.ImageStatus{}, false, nil
	}
	return all[i], true, nil
}

func (w *images) ready(ctx context.Context, m *machine, ref string) (bool, string, error) {
	st, ok, err := status(ctx, m, ref)
	if err != nil || !ok {
		return false, "not listed", err
	}
	return st.State == string(imagecache.StateReady), fmt.Sprintf("%s, %d of %d bytes, error %q", st.State, st.BytesDone, st.BytesTotal, st.Error), nil
}

func (w *images) check(ctx context.Context, m *machine, ref string) (string, error) {
	v, _, err := w.inspect(ctx, m, ref)
	return v, err
}

// inspect asks the guest agent what containerd holds of ref and compares
// it with what was pushed: the same digest, every blob there and hashing
// to its digest, unpacked. It returns what is wrong ("" when nothing) and
// when containerd last wrote the image's record.
func (w *images) inspect(ctx context.Context, m *machine, ref string) (string, time.Time, error) {
	i := slices.IndexFunc(w.all, func(s sourceImage) bool { return s.ref == ref })
	want := w.all[i]
	q := url.Values{"ns": {imageNamespace}, "ref": {ref}, "snapshotter": {imageSnapshotter}}
	b, err := m.get(ctx, "/image?"+q.Encode())
	var ae *agentError
	if errors.As(err, &ae) && ae.code == http.StatusNotFound {
		return ref + " is not in containerd", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, err
	}
	var img agent.Image
	if err := json.Unmarshal(b, &img); err != nil {
		return "", time.Time{}, fmt.Errorf("agent /image: %w", err)
	}
	var bad []string
	if img.Digest != want.digest {
		bad = append(bad, fmt.Sprintf("digest %s, want %s", img.Digest, want.digest))
	}
	bad = append(bad, img.Problems...)
	if len(img.Problems) == 0 && !img.Unpacked {
		bad = append(bad, "not unpacked into "+imageSnapshotter)
	}
	if len(bad) == 0 {
		return "", img.Updated, nil
	}
	return fmt.Sprintf("%s in containerd: %s", ref, strings.Join(bad, "; ")), img.Updated, nil
}

// arm cuts odd cuts uniformly within the pull and even ones within its
// end, where containerd commits the last blobs, unpacks and writes the
// image's record and the daemon labels it. The first pull, which places
// the cuts, writes more than later ones (containerd's first records of
// the namespace and snapshotter): the end is from 3/5 to 5/6 of it.
func (w *images) arm(m *machine, i, length int, rng *mrand.Rand) string {
	if i%2 == 0 {
		m.disk.CutAt(m.disk.Events() + length*3/5 + 1 + rng.IntN(max(1, length*5/6-length*3/5)))
		return "pull's end"
	}
	m.disk.CutAt(m.disk.Events() + 1 + rng.IntN(max(1, length)))
	return "pull"
}

// audit checks every image claimed so far right after a reboot: its claim
// is still wanted, and an image the daemon reports ready is complete in
// containerd.
func (w *images) audit(ctx context.Context, m *machine, poweredOff time.Time) (readyBefore, lost, corrupt []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	all, err := m.client.Images(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("images after the reboot: %w", err)
	}
	for _, src := range w.all {
		i := slices.IndexFunc(all, func(st api.ImageStatus) bool { return st.Ref == src.ref })
		if i < 0 || !slices.Contains(all[i].Wanted, imageOwner) {
			lost = append(lost, src.ref+" was claimed (acknowledged) before the cut and is not wanted after it")
			continue
		}
		if all[i].State != string(imagecache.StateReady) {
			continue
		}
		v, updated, err := w.inspect(ctx, m, src.ref)
		if err != nil {
			return nil, nil, nil, err
		}
		if v != "" {
			corrupt = append(corrupt, "reported ready after the reboot: "+v)
			continue
		}
		if updated.Before(poweredOff.Add(time.Second)) {
			readyBefore = append(readyBefore, src.ref)
		}
	}
	return readyBefore, lost, corrupt, nil
}
