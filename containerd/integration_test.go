package imagecache

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/testimage"
)

// testNS is the namespace the tests pull into: the production default,
// which is safe because every test has a containerd of its own.
const testNS = "k8s.io"

type env struct {
	ctd     *testenv.Containerd
	reg     *testenv.Registry
	stopReg func() error
	client  *client.Client
	cache   *Cache
	metrics *prometheus.Registry
}

// newEnv starts containerd and a registry (anonymous unless auth) and a
// cache whose hosts dir says the registry speaks plain HTTP.
func newEnv(t *testing.T, reg *testenv.Registry, opts Options) *env {
	t.Helper()
	ctd := testenv.StartContainerd(t)
	stopReg := func() error { return errors.New("registry not started by newEnv") }
	if reg == nil {
		testenv.Bin(t, "docker-registry")
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		var err error
		reg, stopReg, err = testenv.StartRegistryProcess(ctx, t.TempDir(), testenv.RegistryOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := stopReg(); err != nil {
				t.Error(err)
			}
		})
	}
	c, err := client.New(ctd.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if opts.HostsDir == "" {
		opts.HostsDir = writeHostsDir(t, reg.Addr)
	}
	opts.Snapshotter = ctd.Snapshotter
	pr := prometheus.NewRegistry()
	opts.Registerer = pr
	opts.DisableECR = true
	opts.Logger = slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ca, err := New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &env{ctd: ctd, reg: reg, stopReg: stopReg, client: c, cache: ca, metrics: pr}
}

// testLog sends the cache's log to the test's, where it shows only for a
// failing test or with -v.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func writeHostsDir(t *testing.T, addr string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, addr), 0o755); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", addr, addr)
	if err := os.WriteFile(filepath.Join(dir, addr, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (e *env) push(t *testing.T, repo, tag string, seed uint64) (ref, dgst string) {
	t.Helper()
	ref = e.reg.Ref(repo, tag)
	d, err := testimage.BuildAndPush(t.Context(), ref, testimage.Spec{Layers: 2, Size: 256 << 10, Seed: seed},
		testimage.Auth{Username: e.reg.Username, Password: e.reg.Password})
	if err != nil {
		t.Fatal(err)
	}
	return ref, d
}

// stopRegistry makes the registry unreachable: every request to its
// address is refused from now on.
func (e *env) stopRegistry(t *testing.T) {
	t.Helper()
	if err := e.stopReg(); err != nil {
		t.Fatal(err)
	}
}

func (e *env) ctx(t *testing.T) context.Context {
	return namespaces.WithNamespace(t.Context(), testNS)
}

func (e *env) labels(t *testing.T, ref string) map[string]string {
	t.Helper()
	img, err := e.client.ImageService().Get(e.ctx(t), ref)
	if err != nil {
		t.Fatalf("get %s: %v", ref, err)
	}
	return img.Labels
}

func (e *env) imageExists(t *testing.T, ref string) bool {
	t.Helper()
	_, err := e.client.ImageService().Get(e.ctx(t), ref)
	if err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

func (e *env) contentExists(t *testing.T, d string) bool {
	t.Helper()
	_, err := e.client.ContentStore().Info(e.ctx(t), digest.Digest(d))
	if err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// newContainer creates a container record (never started) from ref, with
// a snapshot of its root file system, as kubelet would before starting a
// pod.
func (e *env) newContainer(t *testing.T, id, ref string) {
	t.Helper()
	ctx := e.ctx(t)
	img, err := e.client.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithSnapshotter(e.ctd.Snapshotter),
		client.WithNewSnapshot(id+"-rootfs", img),
		client.WithNewSpec(oci.WithImageConfig(img)),
	); err != nil {
		t.Fatalf("new container %s: %v", id, err)
	}
}

func mustEnsure(t *testing.T, c *Cache, ref, owner string) Status {
	t.Helper()
	st, err := c.Ensure(t.Context(), ref, owner)
	if err != nil {
		t.Fatalf("Ensure(%s, %s): %v", ref, owner, err)
	}
	return st
}

func mustRelease(t *testing.T, c *Cache, ref, owner string) Released {
	t.Helper()
	r, err := c.Release(t.Context(), ref, owner)
	if err != nil {
		t.Fatalf("Release(%s, %s): %v", ref, owner, err)
	}
	return r
}

func TestEnsurePullsUnpacksAndLabels(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref, dgst := e.push(t, "warmfleet/app", "v1", 1)

	st := mustEnsure(t, e.cache, ref, "team-a/llama")
	if st.State != StateReady || st.Digest != dgst || !st.Managed || !st.Unpacked {
		t.Fatalf("status %+v, want ready, managed, unpacked, digest %s", st, dgst)
	}
	if st.Size < 256<<10 {
		t.Errorf("size %d, want at least the layer data", st.Size)
	}
	if want := []string{"team-a/llama"}; fmt.Sprint(st.Owners) != fmt.Sprint(want) {
		t.Errorf("owners %v, want %v", st.Owners, want)
	}
	l := e.labels(t, ref)
	if l[LabelManaged] != "true" || l[OwnerLabel("team-a/llama")] == "" {
		t.Fatalf("labels %v lack managed/owner", l)
	}
	// The image is usable the way kubelet would use it: unpacked in the
	// snapshotter of the namespace.
	img, err := e.client.GetImage(e.ctx(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := img.IsUnpacked(e.ctx(t), e.ctd.Snapshotter); err != nil || !ok {
		t.Fatalf("IsUnpacked = %v, %v", ok, err)
	}
	if got := testutil.ToFloat64(e.cache.metrics.pulls.WithLabelValues("pulled")); got != 1 {
		t.Errorf("pulled metric %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.cache.metrics.bytes); got < 256<<10 {
		t.Errorf("bytes metric %v, want at least %d", got, 256<<10)
	}

	// Ensuring again is cheap and changes nothing but the owner set.
	st = mustEnsure(t, e.cache, ref, "team-b")
	if st.Digest != dgst || len(st.Owners) != 2 {
		t.Fatalf("second ensure: %+v", st)
	}
	if got := testutil.ToFloat64(e.cache.metrics.pulls.WithLabelValues("present")); got != 1 {
		t.Errorf("present metric %v, want 1", got)
	}
	list, err := e.cache.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Ref != ref || list[0].State != StateReady {
		t.Fatalf("List = %+v", list)
	}
}

func TestOwnersRefcountRemovesOnlyAtNone(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref, dgst := e.push(t, "warmfleet/shared", "v1", 2)
	mustEnsure(t, e.cache, ref, "a")
	mustEnsure(t, e.cache, ref, "b")

	r := mustRelease(t, e.cache, ref, "a")
	if r.Removed || !strings.Contains(r.Reason, "owned by b") {
		t.Fatalf("after releasing a: %+v", r)
	}
	if !e.imageExists(t, ref) || !e.contentExists(t, dgst) {
		t.Fatal("image gone while b still owns it")
	}
	if _, ok := e.labels(t, ref)[OwnerLabel("a")]; ok {
		t.Fatal("owner label of a still there")
	}
	// Releasing an owner twice, or one that never claimed, changes nothing.
	if r := mustRelease(t, e.cache, ref, "a"); r.Removed {
		t.Fatal("second release of a removed the image")
	}

	r = mustRelease(t, e.cache, ref, "b")
	if !r.Removed {
		t.Fatalf("after releasing b: %+v", r)
	}
	if e.imageExists(t, ref) {
		t.Fatal("image record still there")
	}
	if e.contentExists(t, dgst) {
		t.Fatal("manifest content still there after the last owner left")
	}
	if r := mustRelease(t, e.cache, ref, "b"); r.Removed || r.Reason != "not present" {
		t.Fatalf("release of a removed image: %+v", r)
	}
}

func TestForeignImageIsNeverRemoved(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref, dgst := e.push(t, "warmfleet/foreign", "v1", 3)
	// Somebody else (kubelet, ctr) pulled it first, with a label of its own.
	rc, err := newResolver(t.Context(), e.cache.hostsDir, e.cache.credentials), error(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Pull(e.ctx(t), ref, client.WithPullUnpack, client.WithPullSnapshotter(e.ctd.Snapshotter),
		client.WithResolver(rc), client.WithPullLabel("io.cri-containerd.image", "managed")); err != nil {
		t.Fatal(err)
	}

	st := mustEnsure(t, e.cache, ref, "a")
	if st.Managed || st.State != StateReady || st.Digest != dgst {
		t.Fatalf("status %+v: a foreign image must be ready but not managed", st)
	}
	if got := testutil.ToFloat64(e.cache.metrics.pulls.WithLabelValues("present")); got != 1 {
		t.Errorf("present metric %v, want 1 (no pull)", got)
	}
	r := mustRelease(t, e.cache, ref, "a")
	if r.Removed || !strings.Contains(r.Reason, "not pulled by warmfleet") {
		t.Fatalf("release: %+v", r)
	}
	l := e.labels(t, ref)
	if l["io.cri-containerd.image"] != "managed" || l[LabelManaged] != "" || len(Owners(l)) != 0 {
		t.Fatalf("labels after release %v: foreign label must stay, ours must go", l)
	}
	if removed, err := e.cache.Sweep(t.Context()); err != nil || len(removed) != 0 {
		t.Fatalf("Sweep = %v, %v", removed, err)
	}
	if !e.contentExists(t, dgst) {
		t.Fatal("foreign content removed")
	}
}

func TestImageUsedByContainerIsKept(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref, dgst := e.push(t, "warmfleet/busy", "v1", 4)
	mustEnsure(t, e.cache, ref, "a")
	// A container record (never started) that uses the image, as kubelet
	// would have created.
	ctx := e.ctx(t)
	e.newContainer(t, "pod-1", ref)

	r := mustRelease(t, e.cache, ref, "a")
	if r.Removed || !strings.Contains(r.Reason, "in use by container pod-1") {
		t.Fatalf("release: %+v", r)
	}
	if !e.imageExists(t, ref) || !e.contentExists(t, dgst) {
		t.Fatal("image in use was removed")
	}
	if removed, err := e.cache.Sweep(t.Context()); err != nil || len(removed) != 0 {
		t.Fatalf("Sweep while in use = %v, %v", removed, err)
	}

	if err := e.client.ContainerService().Delete(ctx, "pod-1"); err != nil {
		t.Fatal(err)
	}
	removed, err := e.cache.Sweep(t.Context())
	if err != nil || len(removed) != 1 || removed[0] != ref {
		t.Fatalf("Sweep after the container left = %v, %v", removed, err)
	}
	if e.contentExists(t, dgst) {
		t.Fatal("content still there after sweep")
	}
}

func TestTagMovePullsNewThenReleasesOld(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref, old := e.push(t, "warmfleet/moving", "latest", 5)
	mustEnsure(t, e.cache, ref, "a")
	_, moved := e.push(t, "warmfleet/moving", "latest", 6)
	if moved == old {
		t.Fatal("test image did not change")
	}

	st := mustEnsure(t, e.cache, ref, "a")
	if st.Digest != moved || !st.Managed || !st.Unpacked {
		t.Fatalf("after the move: %+v, want digest %s", st, moved)
	}
	if e.contentExists(t, old) {
		t.Fatal("old manifest still in the content store")
	}
	name, _ := digestName(ref, old)
	if e.imageExists(t, name) {
		t.Fatalf("old digest kept as %s though nothing uses it", name)
	}
}

func TestTagMoveKeepsOldDigestInUse(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref, old := e.push(t, "warmfleet/moving", "latest", 7)
	mustEnsure(t, e.cache, ref, "a")
	e.newContainer(t, "pod-old", ref)
	_, moved := e.push(t, "warmfleet/moving", "latest", 8)
	if st := mustEnsure(t, e.cache, ref, "a"); st.Digest != moved {
		t.Fatalf("after the move: digest %s, want %s", st.Digest, moved)
	}
	name, _ := digestName(ref, old)
	if !e.imageExists(t, name) || !e.contentExists(t, old) {
		t.Fatalf("old digest of a tag a container uses was not kept as %s", name)
	}
	l := e.labels(t, name)
	if !IsManaged(l) || len(Owners(l)) != 0 {
		t.Fatalf("kept record labels %v: want managed, no owners", l)
	}
}

func TestEnsureErrors(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	down := testenv.FreeAddr(t) // nothing listens there
	for _, tc := range []struct {
		name    string
		ref     string
		want    error
		message string
	}{
		{"missing tag", e.reg.Ref("warmfleet/app", "nope"), ErrNotFound, "not found"},
		{"missing repo", e.reg.Ref("warmfleet/never-pushed", "v1"), ErrNotFound, "not found"},
		{"registry down", down + "/warmfleet/app:v1", ErrUnreachable, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := e.cache.Ensure(t.Context(), tc.ref, "a")
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("err = %v, want %v mentioning %q", err, tc.want, tc.message)
			}
			if st.State != StateFailed || st.Error == "" {
				t.Fatalf("status %+v, want failed with the error", st)
			}
			name, _ := NormalizeRef(tc.ref)
			if e.imageExists(t, name) {
				t.Fatal("a failed pull left an image record")
			}
			list, err := e.cache.List(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, s := range list {
				found = found || (s.Ref == name && s.State == StateFailed)
			}
			if !found {
				t.Fatalf("List %+v does not show the failure", list)
			}
			if _, err := e.cache.Release(t.Context(), tc.ref, "a"); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, bad := range []struct{ ref, owner string }{
		{"example.com/Upper/case:v1", "a"},
		{e.reg.Ref("x", "v1"), ""},
		{e.reg.Ref("x", "v1"), "bad owner"},
		{e.reg.Ref("x", "v1"), "../x"},
	} {
		if _, err := e.cache.Ensure(t.Context(), bad.ref, bad.owner); err == nil {
			t.Errorf("Ensure(%q, %q) accepted", bad.ref, bad.owner)
		}
	}
	if got := testutil.ToFloat64(e.cache.metrics.failures.WithLabelValues("not_found")); got != 2 {
		t.Errorf("not_found failures %v, want 2", got)
	}
	if got := testutil.ToFloat64(e.cache.metrics.failures.WithLabelValues("unreachable")); got != 1 {
		t.Errorf("unreachable failures %v, want 1", got)
	}
}

func TestBadCredentials(t *testing.T) {
	reg := testenv.StartRegistryWithAuth(t, "puller", "right-password")
	cfg := filepath.Join(t.TempDir(), "config.json")
	writeAuth := func(pass string) {
		auth := base64.StdEncoding.EncodeToString([]byte("puller:" + pass))
		if err := os.WriteFile(cfg, fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, reg.Addr, auth), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeAuth("wrong-password")
	e := newEnv(t, reg, Options{Namespace: testNS, DockerConfig: cfg})
	ref, dgst := e.push(t, "warmfleet/private", "v1", 9)

	_, err := e.cache.Ensure(t.Context(), ref, "a")
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("err = %v, want ErrUnauthorized with the 401", err)
	}
	// The file is read at every pull: fixing it fixes the next attempt.
	writeAuth("right-password")
	if st := mustEnsure(t, e.cache, ref, "a"); st.Digest != dgst {
		t.Fatalf("after fixing the password: %+v", st)
	}
}

func TestProgressVisibleDuringPull(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref := e.reg.Ref("warmfleet/big", "v1")
	const size = 16 << 20
	if _, err := testimage.BuildAndPush(t.Context(), ref, testimage.Spec{Layers: 4, Size: size, Seed: 10}, testimage.Auth{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := e.cache.Ensure(context.Background(), ref, "a"); done <- err }()
	var sawPulling bool
	var last Status
	for {
		list, err := e.cache.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			if s.State == StatePulling {
				sawPulling = true
				last = s
				if s.BytesDone < 0 || s.BytesTotal > 0 && s.BytesDone > s.BytesTotal {
					t.Fatalf("progress %d/%d", s.BytesDone, s.BytesTotal)
				}
			}
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if !sawPulling {
				t.Fatal("never saw the pull in List")
			}
			t.Logf("last progress seen: %d/%d bytes", last.BytesDone, last.BytesTotal)
			list, _ := e.cache.List(t.Context())
			if len(list) != 1 || list[0].State != StateReady {
				t.Fatalf("after the pull: %+v", list)
			}
			if got := testutil.ToFloat64(e.cache.metrics.bytes); got < size {
				t.Fatalf("bytes metric %v < %d", got, size)
			}
			return
		case <-time.After(time.Millisecond):
		}
	}
}

func TestDialAndOwnedClient(t *testing.T) {
	ctd := testenv.StartContainerd(t)
	c, err := Dial(t.Context(), "unix://"+ctd.Address, Options{Snapshotter: ctd.Snapshotter, DisableECR: true})
	if err != nil {
		t.Fatal(err)
	}
	if list, err := c.List(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("List on an empty containerd = %v, %v", list, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if _, err := Dial(ctx, filepath.Join(t.TempDir(), "none.sock"), Options{}); err == nil {
		t.Fatal("Dial to a missing socket succeeded")
	}
}

func TestEnsureByDigestAndRegistryDownWhilePresent(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref, dgst := e.push(t, "warmfleet/pinned", "v1", 11)
	pinned := strings.TrimSuffix(ref, ":v1") + "@" + dgst
	st := mustEnsure(t, e.cache, pinned, "a")
	if st.Ref != pinned || st.Digest != dgst || !st.Managed || !st.Unpacked {
		t.Fatalf("digest ref: %+v", st)
	}
	mustEnsure(t, e.cache, ref, "a")

	// With the registry gone, images already here stay ready: a digest
	// needs no registry at all, a tag reports that it could not be
	// checked.
	e.stopRegistry(t)
	st = mustEnsure(t, e.cache, pinned, "b")
	if st.State != StateReady || st.Error != "" || len(st.Owners) != 2 {
		t.Fatalf("digest ref with the registry down: %+v", st)
	}
	st = mustEnsure(t, e.cache, ref, "b")
	if st.State != StateReady || !strings.Contains(st.Error, "registry unreachable") || len(st.Owners) != 2 {
		t.Fatalf("tag with the registry down: %+v", st)
	}
}

func TestCanceledPullLeavesNoLease(t *testing.T) {
	e := newEnv(t, nil, Options{Namespace: testNS})
	ref := e.reg.Ref("warmfleet/canceled", "v1")
	if _, err := testimage.BuildAndPush(t.Context(), ref, testimage.Spec{Layers: 4, Size: 32 << 20, Seed: 12}, testimage.Auth{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.cache.Ensure(ctx, ref, "a"); done <- err }()
	// Cancel once bytes flow (or when the pull ends first, on a fast
	// machine; then there is nothing to check).
	var err error
wait:
	for {
		list, lerr := e.cache.List(t.Context())
		if lerr != nil {
			t.Fatal(lerr)
		}
		if len(list) == 1 && list[0].State == StatePulling && list[0].BytesDone > 0 {
			cancel()
		}
		select {
		case err = <-done:
			break wait
		case <-time.After(time.Millisecond):
		}
	}
	if err == nil {
		t.Skip("pull finished before it could be canceled")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if e.imageExists(t, ref) {
		t.Fatal("canceled pull created an image record")
	}
	ls, err := e.client.LeasesService().List(e.ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 0 {
		t.Fatalf("%d leases left after a canceled pull: %+v", len(ls), ls)
	}
	if got := testutil.ToFloat64(e.cache.metrics.failures.WithLabelValues("canceled")); got != 1 {
		t.Errorf("canceled failures %v, want 1", got)
	}
}

// TestCredentialHelperPull pulls from a registry that requires a password
// with the password coming from a docker credential helper executable, as
// config.json's "credHelpers" and "credsStore" name it.
func TestCredentialHelperPull(t *testing.T) {
	reg := testenv.StartRegistryWithAuth(t, "puller", "right-password")
	helpers := installHelpers(t, map[string]string{
		"wftest":  `printf '{"ServerURL":"%s","Username":"puller","Secret":"right-password"}\n' "$url"`,
		"garbage": testHelpers["garbage"],
	})
	cfg := filepath.Join(t.TempDir(), "config.json")
	write := func(format string) {
		t.Helper()
		if err := os.WriteFile(cfg, fmt.Appendf(nil, format, reg.Addr), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnv(t, reg, Options{Namespace: testNS, DockerConfig: cfg})
	ref, dgst := e.push(t, "warmfleet/private", "v1", 9)
	stored, storedDgst := e.push(t, "warmfleet/stored", "v1", 10)

	for _, tc := range []struct{ config, err string }{
		{`{"credHelpers": {%q: "absent"}}`, `credential helper docker-credential-absent: exec: "docker-credential-absent": executable file not found in $PATH`},
		{`{"credHelpers": {%q: "garbage"}}`, "credential helper docker-credential-garbage: get " + reg.Addr + ": invalid character"},
	} {
		write(tc.config)
		if _, err := e.cache.Ensure(t.Context(), ref, "a"); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Fatalf("config %s: err = %v, want %q", tc.config, err, tc.err)
		}
	}
	if e.imageExists(t, ref) {
		t.Fatal("image pulled without credentials")
	}

	write(`{"credHelpers": {%q: "wftest"}}`)
	if st := mustEnsure(t, e.cache, ref, "a"); st.Digest != dgst {
		t.Fatalf("pull with credHelpers: %+v", st)
	}
	asked := helperAsked(t, helpers, "wftest")
	if len(asked) == 0 || asked[0] != reg.Addr {
		t.Fatalf("helper asked about %q, want %s", asked, reg.Addr)
	}

	write(`{"credsStore": "wftest", "credHelpers": {"other.example.com": "absent"}, "auths": {%q: {"auth": "cHVsbGVyOndyb25n"}}}`)
	if st := mustEnsure(t, e.cache, stored, "a"); st.Digest != storedDgst {
		t.Fatalf("pull with credsStore: %+v", st)
	}
	if more := helperAsked(t, helpers, "wftest"); len(more) <= len(asked) || more[len(more)-1] != reg.Addr {
		t.Fatalf("credsStore not asked: helper asked about %q before, %q after", asked, more)
	}
}
