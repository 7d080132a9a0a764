package cli

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// writeConfigMapVolume lays out path the way the kubelet writes a ConfigMap
// volume: path is a symlink into ..data, itself a symlink to a timestamped
// directory that an update replaces by renaming a new symlink over ..data.
func writeConfigMapVolume(t *testing.T, dir, name, content, version string) {
	t.Helper()
	ts := filepath.Join(dir, "..ts-"+version)
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, name)); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRouterReloadsChangedConfigFile: with --config-poll, a router whose
// config is a ConfigMap volume applies an edit without a restart or a
// signal, and keeps running on a broken edit.
func TestRouterReloadsChangedConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "router.yaml")
	const backends = "backends:\n  - url: http://127.0.0.1:9\n"
	writeConfigMapVolume(t, dir, "router.yaml", "strategy: random\n"+backends, "1")
	admin := testenv.FreeAddr(t)
	log := runInBackground(t, "router", "--listen", testenv.FreeAddr(t), "--admin-listen", admin,
		"--config", cfg, "--config-poll", "20ms")
	strategy := func() string {
		resp, err := http.Get("http://" + admin + "/admin/state")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		var st struct{ Strategy string }
		if json.NewDecoder(resp.Body).Decode(&st) != nil {
			return ""
		}
		return st.Strategy
	}
	wait.For(t, "router up with strategy random", func() bool { return strategy() == "random" })

	writeConfigMapVolume(t, dir, "router.yaml", "strategy: least-outstanding\n"+backends, "2")
	wait.For(t, "edited ConfigMap applied", func() bool { return strategy() == "least-outstanding" })

	writeConfigMapVolume(t, dir, "router.yaml", "strategy: nonsense\n"+backends, "3")
	wait.For(t, "broken edit reported", func() bool { return strings.Contains(log.String(), "does not load") })
	if got := strategy(); got != "least-outstanding" {
		t.Fatalf("after a broken edit the strategy is %q, want the running least-outstanding", got)
	}
}

// TestWatchConfigFileReloadsOncePerChange: a reload per content change, not
// per tick, and a failed reload is not retried until the content changes.
func TestWatchConfigFileReloadsOncePerChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte("a"), 0o644); err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int32
		var fail atomic.Bool
		reload := func() error {
			calls.Add(1)
			if fail.Load() {
				return errors.New("bad config")
			}
			return nil
		}
		loaded, err := fileDigest(path)
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		go func() {
			watchConfigFile(ctx, path, loaded, time.Second, reload, slog.New(slog.NewTextHandler(io.Discard, nil)))
		}()
		step := func(content string, wantCalls int32) {
			t.Helper()
			if content != "" {
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(3 * time.Second) // three ticks of the fake clock
			synctest.Wait()
			if got := calls.Load(); got != wantCalls {
				t.Fatalf("after %q: %d reloads, want %d", content, got, wantCalls)
			}
		}
		step("", 0)  // unchanged: no reload
		step("b", 1) // changed: one reload, however many ticks
		fail.Store(true)
		step("c", 2) // changed, reload fails
		step("", 2)  // same content: not retried
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		step("", 2) // unreadable: nothing
		fail.Store(false)
		step("b", 3) // back to earlier content: still a change
	})
}

// TestWatchConfigFileSeesChangeBeforeItStarts: an edit between the load
// and the watcher's start is applied at its first look (the watcher
// compared against the file as it found it, and missed that edit until
// the next one: CI's TestRouterReloadsChangedConfigFile once did).
func TestWatchConfigFileSeesChangeBeforeItStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte("a"), 0o644); err != nil {
			t.Fatal(err)
		}
		loaded, err := fileDigest(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("b"), 0o644); err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int32
		go watchConfigFile(t.Context(), path, loaded, time.Second, func() error { calls.Add(1); return nil },
			slog.New(slog.NewTextHandler(io.Discard, nil)))
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := calls.Load(); got != 1 {
			t.Fatalf("%d reloads, want 1", got)
		}
	})
}
