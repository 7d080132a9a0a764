package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/lab/s3bench"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// buildLab builds ./cmd/warmfleet-lab into dir, with -race when this test
// binary has it (so CI shares the build with the integration tests').
func buildLab(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "warmfleet-lab")
	args := []string{"build", "-o", bin}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	cmd := exec.CommandContext(t.Context(), "go", append(args, "./cmd/warmfleet-lab")...)
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestBenchS3Command runs the real `warmfleet-lab bench s3` binary on a tiny
// model: every method runs once, every copy verifies (the command fails
// otherwise), and the JSON report has the figures the issue asks for. It
// asserts the report's shape, never its timings.
func TestBenchS3Command(t *testing.T) {
	testenv.Bin(t, "versitygw")
	testenv.Bin(t, "rclone")
	testenv.Bin(t, "dd")
	bin := buildLab(t, t.TempDir())
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "s3", "--model-size", "3MiB", "--files", "2", "--runs", "1",
		"--part-size", "1MiB", "--pause", "0", "--drop-caches=false", "--read-runs", "1", "--dir", work, "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench s3: %v\nstderr: %s\nstdout: %s", err, stderr.String(), stdout.String())
	}
	t.Logf("report:\n%s", stdout.String())
	var rep struct {
		Bytes   int64 `json:"bytes"`
		Files   int   `json:"files"`
		Methods []struct {
			Method  string  `json:"method"`
			Skipped string  `json:"skipped"`
			VsPlain float64 `json:"vs_plain"`
			VsRcl   float64 `json:"vs_rclone"`
			PeakRSS int64   `json:"peak_rss_bytes"`
			Samples []struct {
				Seconds float64 `json:"seconds"`
				S3Bytes int64   `json:"s3_bytes"`
			} `json:"samples"`
		} `json:"methods"`
		ReadBack *struct {
			CachedExt int    `json:"cached_extents"`
			DDExt     int    `json:"dd_extents"`
			Cold      bool   `json:"cold_cache"`
			Note      string `json:"note"`
			Readers   []struct {
				Ratio  float64 `json:"cached_over_dd"`
				Cached struct {
					Seconds []float64 `json:"seconds"`
				} `json:"cached"`
				DD struct {
					Seconds []float64 `json:"seconds"`
				} `json:"dd"`
			} `json:"readers"`
		} `json:"read_back"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	// 2 shards, config.json and the index.
	if rep.Files != 4 || rep.Bytes < 3<<20 {
		t.Errorf("files %d, bytes %d", rep.Files, rep.Bytes)
	}
	if len(rep.Methods) != len(s3bench.AllMethods()) {
		t.Fatalf("methods %+v, want %v", rep.Methods, s3bench.AllMethods())
	}
	for i, m := range rep.Methods {
		if m.Method != s3bench.AllMethods()[i] || m.Skipped != "" || len(m.Samples) != 1 || m.Samples[0].Seconds <= 0 || m.PeakRSS <= 0 || m.VsPlain <= 0 || m.VsRcl <= 0 {
			t.Errorf("method %d: %+v", i, m)
		}
	}
	if d := rep.Methods[0]; len(d.Samples) == 1 && d.Samples[0].S3Bytes != rep.Bytes {
		t.Errorf("daemon read %d bytes from S3, the model has %d", d.Samples[0].S3Bytes, rep.Bytes)
	}
	if rb := rep.ReadBack; rb == nil || rb.Cold || rb.Note == "" || len(rb.Readers) != 2 || rb.CachedExt == 0 || rb.DDExt == 0 {
		t.Fatalf("read-back %+v", rb)
	}
	for _, r := range rep.ReadBack.Readers {
		if r.Ratio <= 0 || len(r.Cached.Seconds) != 1 || len(r.DD.Seconds) != 1 {
			t.Errorf("reader %+v", r)
		}
	}
	// Only the daemon's log stays behind: S3 data, copies and caches are gone.
	entries, err := os.ReadDir(work)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "daemon.log" {
			t.Errorf("left behind in --dir: %s", e.Name())
		}
	}
}
