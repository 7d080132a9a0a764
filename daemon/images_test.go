package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	imagecache "github.com/warmfleet/warmfleet/containerd"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/testimage"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/spec"
)

func TestPlanImages(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := claim{"r/a:1", "x"}, claim{"r/b:1", "y"}
	set := func(cs ...claim) map[claim]bool {
		m := map[claim]bool{}
		for _, c := range cs {
			m[c] = true
		}
		return m
	}
	tests := []struct {
		name            string
		w               imageWorld
		ensure, release []claim
	}{
		{"wanted and missing: pull", imageWorld{desired: set(a)}, []claim{a}, nil},
		{"held and checked: nothing", imageWorld{desired: set(a), held: set(a), checked: map[claim]time.Time{a: now}, resync: time.Hour}, nil, nil},
		{"held but never checked by this run: ensure (tag may have moved)", imageWorld{desired: set(a), held: set(a)}, []claim{a}, nil},
		{"resync due", imageWorld{desired: set(a), held: set(a), checked: map[claim]time.Time{a: now.Add(-2 * time.Hour)}, resync: time.Hour}, []claim{a}, nil},
		{"running: wait", imageWorld{desired: set(a), running: set(a)}, nil, nil},
		{"failed: back off", imageWorld{desired: set(a), failures: map[claim]imageFailure{a: {nextTry: now.Add(time.Second)}}}, nil, nil},
		{"failed: retry after backoff", imageWorld{desired: set(a), failures: map[claim]imageFailure{a: {nextTry: now}}}, []claim{a}, nil},
		{"held, not wanted: release", imageWorld{held: set(b)}, nil, []claim{b}},
		{"held, not wanted, running: wait", imageWorld{held: set(b), running: set(b)}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.w.now = now
			ensure, release := planImages(tt.w)
			if !slices.Equal(ensure, tt.ensure) || !slices.Equal(release, tt.release) {
				t.Fatalf("planImages = %v, %v; want %v, %v", ensure, release, tt.ensure, tt.release)
			}
		})
	}
}

// TestImageCacheThroughDaemon pre-pulls an image from a real registry into a
// real containerd through the daemon's desired state, with two owners.
func TestImageCacheThroughDaemon(t *testing.T) {
	ctd := testenv.StartContainerd(t)
	reg := testenv.StartRegistry(t)
	ref := reg.Addr + "/vllm/vllm:v1"
	if _, err := testimage.BuildAndPush(t.Context(), ref, testimage.Spec{Layers: 3, Size: 3 << 20, Seed: 5}, testimage.Auth{}); err != nil {
		t.Fatal(err)
	}
	hosts := t.TempDir()
	if err := os.MkdirAll(filepath.Join(hosts, reg.Addr), 0o755); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", reg.Addr, reg.Addr)
	if err := os.WriteFile(filepath.Join(hosts, reg.Addr, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cache, err := imagecache.Dial(t.Context(), "unix://"+ctd.Address, imagecache.Options{
		Namespace: "k8s.io", Snapshotter: ctd.Snapshotter, HostsDir: hosts, DisableECR: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	d := newDaemonDeps(t, t.TempDir(), nil, Deps{Images: cache})
	run(t, d)

	image := func() api.ImageStatus {
		all, err := d.Images(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range all {
			if im.Ref == ref {
				return im
			}
		}
		return api.ImageStatus{}
	}
	for _, owner := range []string{"deploy-a", "deploy-b"} {
		if err := d.AddImage(t.Context(), spec.Spec{Kind: spec.KindImage, Name: ref, Owner: owner}); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, "image ready with both owners", func() bool {
		im := image()
		return im.State == "ready" && im.Unpacked && im.Managed && slices.Equal(im.Owners, []string{"deploy-a", "deploy-b"})
	})
	if _, err := d.RemoveImage(t.Context(), ref, "deploy-a"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "one owner left", func() bool { return slices.Equal(image().Owners, []string{"deploy-b"}) })
	if im := image(); im.State != "ready" {
		t.Fatalf("image removed while an owner remains: %+v", im)
	}
	if _, err := d.RemoveImage(t.Context(), ref, "deploy-b"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "image removed", func() bool { return image().Ref == "" })

	// A reference that does not exist fails clearly and is retried, never blocking.
	missing := reg.Addr + "/nope/nope:1"
	if err := d.AddImage(t.Context(), spec.Spec{Kind: spec.KindImage, Name: missing, Owner: "x"}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "missing image failed", func() bool {
		all, _ := d.Images(t.Context())
		for _, im := range all {
			if im.Ref == missing && im.State == "failed" && im.Error != "" {
				return true
			}
		}
		return false
	})
	if err := d.AddImage(t.Context(), spec.Spec{Kind: spec.KindImage, Name: "UPPER/case", Owner: "x"}); err == nil {
		t.Fatal("invalid reference accepted")
	}
}
