package nvme

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckRelPath(t *testing.T) {
	tests := []struct {
		path string
		ok   bool
	}{
		{"model.safetensors", true},
		{"sub/dir/tokenizer.json", true},
		{"..hidden", true},
		{"", false},
		{"../x", false},
		{"a/../../x", false},
		{"/etc/passwd", false},
		{"a//b", false},
		{"a/./b", false},
		{"a/", false},
		{"a\x00b", false},
		{"a\\..\\b", false},
		{"line\nbreak", false},
		{strings.Repeat("a", 256), false},
		{strings.Repeat("a/", 600) + "x", false},
	}
	for _, tt := range tests {
		err := CheckRelPath(tt.path)
		if (err == nil) != tt.ok {
			t.Errorf("CheckRelPath(%q) = %v, want ok=%v", tt.path, err, tt.ok)
		}
	}
}

func TestCheckName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"llama-3-8b", true},
		{"meta/llama-3-8b", true},
		{"a/b/c", false},
		{"../x", false},
		{"a--b", false},
		{".hidden", false},
		{"", false},
		{"/abs", false},
	}
	for _, tt := range tests {
		if err := CheckName(tt.name); (err == nil) != tt.ok {
			t.Errorf("CheckName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func FuzzCheckRelPath(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "/abs", "a\x00", "a//b", "x/./y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if CheckRelPath(p) != nil {
			return
		}
		// An accepted path must stay below any base it is joined to.
		base := "/data/partial/m/r"
		joined := filepath.Join(base, p)
		if !strings.HasPrefix(joined, base+"/") {
			t.Fatalf("accepted %q escapes to %q", p, joined)
		}
		if filepath.Clean(p) != p {
			t.Fatalf("accepted non-canonical %q", p)
		}
	})
}

func openStore(t *testing.T, opts Options) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func stageFile(t *testing.T, st *Staging, rel, content string) {
	t.Helper()
	f, err := st.OpenFile(rel, int64(len(content)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(content), 0); err != nil {
		t.Fatal(err)
	}
}

func TestStagePublishLayout(t *testing.T) {
	s := openStore(t, Options{})
	st, err := s.Stage("meta/llama", "rev1")
	if err != nil {
		t.Fatal(err)
	}
	stageFile(t, st, "model.safetensors", "weights")
	stageFile(t, st, "sub/config.json", "{}")
	if s.Published("meta/llama", "rev1") {
		t.Fatal("revision visible before publish")
	}
	if _, err := s.Current("meta/llama"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Current before publish = %v, want ErrNotFound", err)
	}
	dir, err := s.Publish(st)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(s.Dir(), "models", "meta--llama", "rev1")
	if dir != want {
		t.Fatalf("published at %s, want %s", dir, want)
	}
	got, err := os.ReadFile(filepath.Join(s.ModelDir("meta/llama"), CurrentLink, "sub", "config.json"))
	if err != nil || string(got) != "{}" {
		t.Fatalf("read through current link: %q, %v", got, err)
	}
	if _, err := os.Stat(st.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("staging dir left behind: %v", err)
	}
	models, err := s.Models()
	if err != nil || len(models) != 1 || models[0] != "meta/llama" {
		t.Fatalf("Models() = %v, %v", models, err)
	}

	// A second revision replaces the current link atomically; the old one
	// can then be removed, the current one not.
	st2, err := s.Stage("meta/llama", "rev2")
	if err != nil {
		t.Fatal(err)
	}
	stageFile(t, st2, "model.safetensors", "weights v2")
	if _, err := s.Publish(st2); err != nil {
		t.Fatal(err)
	}
	if cur, err := s.Current("meta/llama"); err != nil || cur != "rev2" {
		t.Fatalf("Current = %q, %v; want rev2", cur, err)
	}
	if err := s.RemoveRevision("meta/llama", "rev2"); !errors.Is(err, ErrCurrent) {
		t.Fatalf("RemoveRevision of the current revision = %v, want ErrCurrent", err)
	}
	if err := s.RemoveRevision("meta/llama", "rev1"); err != nil {
		t.Fatal(err)
	}
	if s.Published("meta/llama", "rev1") {
		t.Fatal("old revision survived prune")
	}
	if err := s.Remove("meta/llama"); err != nil {
		t.Fatal(err)
	}
	if models, _ := s.Models(); len(models) != 0 {
		t.Fatalf("Models() after Remove = %v", models)
	}
}

func TestResumeKeepsStagedContent(t *testing.T) {
	s := openStore(t, Options{})
	st, err := s.Stage("m", "r")
	if err != nil {
		t.Fatal(err)
	}
	stageFile(t, st, "f", "half")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st, err = s.Stage("m", "r")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f, err := st.OpenFile("f", 4)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "half" {
		t.Fatalf("resumed content %q, %v", buf, err)
	}
}

func TestHostilePathsStayInside(t *testing.T) {
	s := openStore(t, Options{})
	st, err := s.Stage("m", "r")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, p := range []string{"../x", "../../../../tmp/x", "/etc/x", "a/../../x", "a\x00b"} {
		if _, err := st.OpenFile(p, 1); err == nil {
			t.Errorf("OpenFile(%q) succeeded", p)
		}
	}
	// A symlink planted in the staging area must not be followed outside.
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(st.Dir(), "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.OpenFile("link/escape", 1); err == nil {
		t.Error("OpenFile through a symlink to outside succeeded")
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("wrote outside the data dir: %v", entries)
	}
	if _, err := s.Stage("../evil", "r"); err == nil {
		t.Error("Stage accepted a hostile model name")
	}
	if _, err := s.Stage("m", ".."); err == nil {
		t.Error("Stage accepted a hostile revision")
	}
}

func TestFits(t *testing.T) {
	tests := []struct {
		need, free, reserve int64
		ok                  bool
	}{
		{10, 100, 0, true},
		{100, 100, 0, true},
		{101, 100, 0, false},
		{50, 100, 60, false},
		{40, 100, 60, true},
	}
	for _, tt := range tests {
		err := Fits(tt.need, Space{Total: 1000, Free: tt.free}, tt.reserve)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrNoSpace)) {
			t.Errorf("Fits(%d, free %d, reserve %d) = %v, want ok=%v", tt.need, tt.free, tt.reserve, err, tt.ok)
		}
	}
}

func TestReserveUsesLargerOfBytesAndFraction(t *testing.T) {
	s := openStore(t, Options{ReserveBytes: 100, ReserveFraction: 0.2, StatFS: func(string) (Space, error) {
		return Space{Total: 1000, Free: 500}, nil
	}})
	if got := s.Reserve(Space{Total: 1000}); got != 200 {
		t.Fatalf("Reserve = %d, want 200", got)
	}
	if err := s.CheckFits(301); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("CheckFits(301) = %v, want ErrNoSpace", err)
	}
	if avail, _ := s.Available(); avail != 300 {
		t.Fatalf("Available = %d, want 300", avail)
	}
}

// TestFullDiskFailsAtPreallocation needs root to mount a small tmpfs.
func TestFullDiskFailsAtPreallocation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := s.Stage("m", "r")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.OpenFile("big", 64<<20); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("OpenFile(64 MiB) on a 4 MiB disk = %v, want ErrNoSpace", err)
	}
}

func TestOpenRejectsBadReserve(t *testing.T) {
	for _, opts := range []Options{{ReserveBytes: -1}, {ReserveFraction: -0.1}, {ReserveFraction: 1}, {ReserveFraction: math.NaN()}} {
		if s, err := Open(t.TempDir(), opts); err == nil {
			s.Close()
			t.Errorf("%+v accepted", opts)
		}
	}
}

// Two accepted names must never share a directory, and the directory must
// name the model back: otherwise Remove of one deletes the other's cache
// and Models reports a model that was never cached.
func TestNamesDoNotCollideOnDisk(t *testing.T) {
	tests := []struct{ a, b string }{
		{"org-/model", "org/-model"}, // both "org---model"
		{"a-/b", "a/-b"},
		{"a/b", "a--b"}, // "a--b" is rejected, so it cannot collide
	}
	for _, tt := range tests {
		if CheckName(tt.a) == nil && CheckName(tt.b) == nil && dirName(tt.a) == dirName(tt.b) {
			t.Errorf("%q and %q are both accepted and share directory %q", tt.a, tt.b, dirName(tt.a))
		}
	}

	s := openStore(t, Options{})
	st, err := s.Stage("org-/model", "r")
	if err != nil {
		t.Fatal(err)
	}
	stageFile(t, st, "w", "weights")
	if _, err := s.Publish(st); err != nil {
		t.Fatal(err)
	}
	if models, err := s.Models(); err != nil || len(models) != 1 || models[0] != "org-/model" {
		t.Errorf("Models() = %q, %v; want [org-/model]", models, err)
	}
	// Removing (or asking about) a different model must not touch this one.
	_ = s.Remove("org/-model")
	if cur, err := s.Current("org-/model"); err != nil || cur != "r" {
		t.Fatalf("after Remove of another model, Current = %q, %v", cur, err)
	}
}

// Long segments that each pass must not make a directory name longer than
// a file system allows; the name is refused up front with a clear error.
func TestCheckNameBoundsDirName(t *testing.T) {
	long := strings.Repeat("a", 200) + "/" + strings.Repeat("b", 200)
	if err := CheckName(long); err == nil {
		t.Fatalf("CheckName accepted a name whose directory is %d bytes", len(dirName(long)))
	}
}

func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"m", "org/model", "a-/b", "a/-b", "a--b", "-/-", "../x", ".a/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if CheckName(name) != nil {
			return
		}
		// An accepted name is one directory below models/ and names itself.
		dir := dirName(name)
		if err := CheckSegment(dir); err != nil {
			t.Fatalf("accepted %q maps to an invalid directory %q: %v", name, dir, err)
		}
		if back := nameOfDir(dir); back != name {
			t.Fatalf("accepted %q maps to %q, which reads back as %q", name, dir, back)
		}
	})
}

// Published answers for a revision directory, never for whatever a hostile
// name or revision resolves to ("m/.." is models/ itself).
func TestPublishedRejectsHostileNames(t *testing.T) {
	s := openStore(t, Options{})
	st, err := s.Stage("org/m", "r")
	if err != nil {
		t.Fatal(err)
	}
	stageFile(t, st, "w", "weights")
	if _, err := s.Publish(st); err != nil {
		t.Fatal(err)
	}
	if !s.Published("org/m", "r") {
		t.Fatal("published revision not reported")
	}
	for _, q := range []struct{ name, rev string }{
		{"org/m", ".."}, {"org/m", "."}, {"org/m", ""}, {"org--m", "r"}, {"org/m", "r/"}, {"org/m", "../m/r"},
	} {
		if s.Published(q.name, q.rev) {
			t.Errorf("Published(%q, %q) = true", q.name, q.rev)
		}
	}
}

// A file an earlier attempt left longer than the object now is must not
// keep its tail: verification reads only size bytes, so the extra bytes
// would be published as good.
func TestOpenFileCutsLongerStagedFile(t *testing.T) {
	s := openStore(t, Options{})
	st, err := s.Stage("m", "r")
	if err != nil {
		t.Fatal(err)
	}
	stageFile(t, st, "f", "stale content from an earlier attempt")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st, err = s.Stage("m", "r")
	if err != nil {
		t.Fatal(err)
	}
	stageFile(t, st, "f", "new!")
	dir, err := s.Publish(st)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(got) != "new!" {
		t.Fatalf("published %q, %v; want %q", got, err, "new!")
	}
}

// A symlink planted where a model's directory belongs (models/<name>,
// partial/<name>, or models/ and partial/ themselves) is never followed out
// of the data directory: not to write, not to publish, not to delete.
func TestPlantedModelDirSymlinksStayInside(t *testing.T) {
	for _, where := range []string{"partial/m", "models/m", "partial", "models"} {
		t.Run(where, func(t *testing.T) {
			s := openStore(t, Options{})
			outside := t.TempDir()
			if err := os.MkdirAll(filepath.Join(outside, "r"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, "r", "w"), []byte("theirs"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("r", filepath.Join(outside, CurrentLink)); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(s.Dir(), where)
			if err := os.RemoveAll(link); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, link); err != nil {
				t.Fatal(err)
			}
			if st, err := s.Stage("m", "r"); err == nil {
				if _, err := st.OpenFile("w", 4); err == nil {
					_, _ = s.Publish(st)
				}
				st.Close()
			}
			if s.Published("m", "r") {
				t.Error("a revision outside the data dir counts as published")
			}
			if cur, err := s.Current("m"); err == nil {
				t.Errorf("Current followed the planted link to %q", cur)
			}
			_ = s.RemoveRevision("m", "r")
			_ = s.PruneStaged("m", "other")
			_ = s.Remove("m")
			if got, err := os.ReadFile(filepath.Join(outside, "r", "w")); err != nil || string(got) != "theirs" {
				t.Errorf("file outside the data dir is now %q, %v", got, err)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 2 {
				t.Errorf("outside the data dir now holds %d entries, want 2", len(entries))
			}
		})
	}
}

// A revision may not be named like the entries Publish keeps beside the
// revisions: staged as "current", a failed publish left a directory where
// the link belongs, Models listed the model as published, and every later
// publish of it failed.
func TestStageRejectsReservedRevisionNames(t *testing.T) {
	s := openStore(t, Options{})
	for _, rev := range []string{CurrentLink, ".current.tmp", ".hidden"} {
		st, err := s.Stage("m", rev)
		if err == nil {
			stageFile(t, st, "w", "x")
			_, perr := s.Publish(st)
			t.Errorf("Stage(%q) accepted (publish: %v)", rev, perr)
		}
	}
	if models, _ := s.Models(); len(models) != 0 {
		t.Errorf("Models() = %q after no successful publish", models)
	}
}

// TestRetiredRevisionsOneByOne: after an update the old revision can be
// listed, measured and deleted on its own, the current one never; staged
// downloads of other revisions go without touching published ones.
func TestRetiredRevisionsOneByOne(t *testing.T) {
	s := openStore(t, Options{})
	weights := strings.Repeat("w", 64<<10)
	for _, rev := range []string{"rev1", "rev2"} {
		st, err := s.Stage("meta/llama", rev)
		if err != nil {
			t.Fatal(err)
		}
		stageFile(t, st, "model.safetensors", weights+rev)
		if _, err := s.Publish(st); err != nil {
			t.Fatal(err)
		}
	}
	abandoned, err := s.Stage("meta/llama", "rev3")
	if err != nil {
		t.Fatal(err)
	}
	stageFile(t, abandoned, "model.safetensors", "half")
	abandoned.Close()

	revs, err := s.Revisions("meta/llama")
	if err != nil || strings.Join(revs, ",") != "rev1,rev2" {
		t.Fatalf("Revisions = %v, %v; want rev1,rev2", revs, err)
	}
	if revs, err := s.Revisions("other"); err != nil || len(revs) != 0 {
		t.Fatalf("Revisions of an unknown model = %v, %v", revs, err)
	}
	n, err := s.RevisionBytes("meta/llama", "rev1")
	if err != nil || n < int64(len(weights)) {
		t.Fatalf("RevisionBytes = %d, %v; want >= %d", n, err, len(weights))
	}

	if err := s.PruneStaged("meta/llama", "rev2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abandoned.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("abandoned staging survived: %v", err)
	}
	if !s.Published("meta/llama", "rev1") || !s.Published("meta/llama", "rev2") {
		t.Fatal("PruneStaged deleted a published revision")
	}

	if err := s.RemoveRevision("meta/llama", "rev2"); !errors.Is(err, ErrCurrent) {
		t.Fatalf("RemoveRevision(current) = %v, want ErrCurrent", err)
	}
	if err := s.RemoveRevision("meta/llama", "rev1"); err != nil {
		t.Fatal(err)
	}
	if s.Published("meta/llama", "rev1") || !s.Published("meta/llama", "rev2") {
		t.Fatal("RemoveRevision removed the wrong revision")
	}
	if err := s.RemoveRevision("meta/llama", "rev1"); err != nil {
		t.Fatalf("RemoveRevision of a gone revision = %v", err)
	}
	for _, bad := range []string{"..", "current", ".hidden", "a/b", ""} {
		if err := s.RemoveRevision("meta/llama", bad); err == nil {
			t.Errorf("RemoveRevision(%q) accepted", bad)
		}
		if _, err := s.RevisionBytes("meta/llama", bad); err == nil {
			t.Errorf("RevisionBytes(%q) accepted", bad)
		}
	}
	if !s.Published("meta/llama", "rev2") {
		t.Fatal("a hostile revision name reached the current revision")
	}
}

// TestInspectAndUnpublish: Inspect finds a missing, resized or replaced
// file and a missing or wrong link by stat alone; Unpublish moves the
// revision back to staging, unlinked, without the dropped files.
func TestInspectAndUnpublish(t *testing.T) {
	s := openStore(t, Options{})
	st, err := s.Stage("m", "r1")
	if err != nil {
		t.Fatal(err)
	}
	stageFile(t, st, "a", "aaaa")
	stageFile(t, st, "sub/b", "bb")
	stageFile(t, st, "c", "c")
	path, err := s.Publish(st)
	if err != nil {
		t.Fatal(err)
	}
	want := []WantFile{{Path: "a", Size: 4}, {Path: "sub/b", Size: 2}, {Path: "c", Size: 1}}
	if dmg, err := s.Inspect("m", "r1", want); err != nil || !dmg.OK() {
		t.Fatalf("intact revision: %+v, %v", dmg, err)
	}
	if dmg, err := s.Inspect("m", "r2", want); err != nil || !dmg.LinkBroken || len(dmg.Files) != 3 {
		t.Fatalf("revision that is not current and not there: %+v, %v", dmg, err)
	}
	if err := os.Remove(filepath.Join(path, "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "sub", "b"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(path, "c")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(path, "c"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(s.ModelDir("m"), CurrentLink)); err != nil {
		t.Fatal(err)
	}
	dmg, err := s.Inspect("m", "r1", want)
	if err != nil {
		t.Fatal(err)
	}
	if !dmg.LinkBroken || dmg.Files["a"] != "missing" || !strings.HasPrefix(dmg.Files["sub/b"], "size 1") || !strings.HasPrefix(dmg.Files["c"], "not a regular file") {
		t.Fatalf("damage = %+v", dmg)
	}
	if _, err := s.Inspect("m", "r1", []WantFile{{Path: "../x"}}); err == nil {
		t.Fatal("Inspect accepted a path outside the revision")
	}

	if err := s.Unpublish("m", "r1", []string{"sub/b", "c"}); err != nil {
		t.Fatal(err)
	}
	if s.Published("m", "r1") {
		t.Fatal("still published after Unpublish")
	}
	staged := filepath.Join(s.Dir(), "partial", "m", "r1")
	for _, gone := range []string{"sub/b", "c"} {
		if _, err := os.Lstat(filepath.Join(staged, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("dropped %s still staged: %v", gone, err)
		}
	}
	if err := s.Unpublish("m", "r1", []string{"../../x"}); err == nil {
		t.Fatal("Unpublish accepted a path outside the revision")
	}
	if _, err := os.Stat(filepath.Join(staged, "sub")); err != nil {
		t.Fatalf("a refused Unpublish touched the staged revision: %v", err)
	}
}
