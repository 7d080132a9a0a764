package fleetbench

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMeasurePageCache(t *testing.T) {
	dir := t.TempDir()
	pc, err := measurePageCache(context.Background(), dir, 8<<20+1, time.Millisecond) // not a whole number of writes
	if err != nil {
		t.Fatal(err)
	}
	if pc.Bytes != 8<<20+1 || pc.AfterPauseCPUSecondsPerGiB < 0 || pc.AtOnceCPUSecondsPerGiB < 0 {
		t.Fatalf("page cache %+v", pc)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("probe left %v behind", left)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := measurePageCache(ctx, dir, 1<<20, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("probe with its context cancelled in the pause: %v", err)
	}
	if _, err := measurePageCache(context.Background(), filepath.Join(dir, "missing"), 1<<20, 0); err == nil || !strings.Contains(err.Error(), "page cache probe") {
		t.Fatalf("probe in a missing directory: %v", err)
	}
}

func TestFreePageReporting(t *testing.T) {
	old := balloonFeatures
	t.Cleanup(func() { balloonFeatures = old })
	dir := t.TempDir()
	balloonFeatures = filepath.Join(dir, "virtio*", "features")
	if got := freePageReporting(); got != nil {
		t.Fatalf("no balloon bound: %v, want nil", *got)
	}
	dev := filepath.Join(dir, "virtio0")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for features, want := range map[string]bool{
		"0110010100000000000000000000000010000000000000000000000000000000\n": true, // this VM's
		"0110000100000000000000000000000010000000000000000000000000000000\n": false,
	} {
		if err := os.WriteFile(filepath.Join(dev, "features"), []byte(features), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := freePageReporting(); got == nil || *got != want {
			t.Fatalf("features %q: %v, want %v", features, got, want)
		}
	}
	for on, want := range map[bool]string{true: "takes it back", false: "without free page reporting"} {
		var buf bytes.Buffer
		r := Result{SettleSeconds: 10, PageCache: &PageCache{Bytes: 1 << 28, AfterPauseCPUSecondsPerGiB: 4.4, AtOnceCPUSecondsPerGiB: 0.3, FreePageReporting: &on}}
		if err := r.WriteTable(&buf); err != nil {
			t.Fatal(err)
		}
		if out := buf.String(); !strings.Contains(out, "freed 10 s before cost 4.40 CPU-s per GiB, 0.30 into memory just freed") || !strings.Contains(out, want) {
			t.Fatalf("table:\n%s", out)
		}
	}
}
