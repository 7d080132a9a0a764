package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/s3origin/s3bench"
	"github.com/warmfleet/warmfleet/internal/synthmodel"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// buildWarmfleet builds ./cmd/warmfleet into dir, with -race when this test
// binary has it (so CI shares the build with the integration tests').
func buildWarmfleet(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "warmfleet")
	args := []string{"build", "-o", bin}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	cmd := exec.CommandContext(t.Context(), "go", append(args, "./cmd/warmfleet")...)
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestBenchS3Command runs the real `warmfleet bench s3` binary on a tiny
// model: every method runs once, every copy verifies (the command fails
// otherwise), and the JSON report has the figures the issue asks for. It
// asserts the report's shape, never its timings.
func TestBenchS3Command(t *testing.T) {
	testenv.Bin(t, "versitygw")
	testenv.Bin(t, "rclone")
	testenv.Bin(t, "dd")
	bin := buildWarmfleet(t, t.TempDir())
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

// BenchmarkDaemonCacheS3 runs the `warmfleet daemon` command in-process
// against a real S3 server and caches a synthetic model once per iteration,
// so a CPU profile shows where the daemon spends its time:
//
//	WARMFLEET_BENCH_CPUPROFILE=/tmp/daemon.pprof go test -run '^$' \
//	  -bench DaemonCacheS3 -benchtime 3x ./internal/cli/
//	go tool pprof -top /tmp/daemon.pprof
//
// The profile covers only the caching, not the model's upload.
// WARMFLEET_BENCH_MODEL_SIZE sets the model size (default 512MiB), and
// WARMFLEET_BENCH_DAEMON_ARGS extra daemon flags (space-separated).
func BenchmarkDaemonCacheS3(b *testing.B) {
	size := int64(512 << 20)
	if v := os.Getenv("WARMFLEET_BENCH_MODEL_SIZE"); v != "" {
		n, err := parseBytes(v)
		if err != nil {
			b.Fatal(err)
		}
		size = n
	}
	s3 := testenv.StartS3(b)
	for _, kv := range s3.Env() {
		k, v, _ := strings.Cut(kv, "=")
		b.Setenv(k, v)
	}
	b.Setenv("AWS_PROFILE", "")
	b.Setenv("AWS_SESSION_TOKEN", "")
	s3.CreateBucket(b, "bench")
	model, err := synthmodel.New(synthmodel.Options{Seed: 1, Size: size, Shards: 4})
	if err != nil {
		b.Fatal(err)
	}
	err = model.Upload(b.Context(), func(ctx context.Context, key string, r io.Reader, size int64) error {
		return s3.Put(ctx, "bench", "model/"+key, r, size)
	})
	if err != nil {
		b.Fatal(err)
	}

	dir := b.TempDir()
	sock := "unix://" + filepath.Join(dir, "api.sock")
	logBuf := &syncBuffer{}
	ctx, cancel := context.WithCancel(b.Context())
	exited := make(chan int, 1)
	args := []string{"daemon", "--data-dir", filepath.Join(dir, "data"), "--api", sock,
		"--reserve", "0", "--reserve-fraction", "0", "--resync-interval", "0"}
	args = append(args, strings.Fields(os.Getenv("WARMFLEET_BENCH_DAEMON_ARGS"))...)
	go func() {
		exited <- Run(ctx, args, &Env{Stdout: logBuf, Stderr: logBuf, Getenv: func(string) string { return "" }})
	}()
	defer func() {
		cancel()
		if code := <-exited; code != 0 {
			b.Errorf("daemon exited %d: %s", code, logBuf.String())
		}
	}()
	client, err := api.NewClient(sock, "")
	if err != nil {
		b.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		if _, err := client.Node(ctx); err == nil {
			break
		} else if time.Since(start) > 30*time.Second {
			b.Fatalf("daemon API: %v\n%s", err, logBuf.String())
		}
	}

	if path := os.Getenv("WARMFLEET_BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	b.SetBytes(model.TotalSize())
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("m%d", i)
		if _, err := client.AddCache(ctx, api.AddCacheRequest{Name: name, Source: "s3://bench/model/"}); err != nil {
			b.Fatal(err)
		}
		for {
			st, err := client.Cache(ctx, name)
			if err != nil || st.State == api.StateFailed {
				b.Fatalf("cache %s: %+v %v\n%s", name, st, err, logBuf.String())
			}
			if st.Ready {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.StopTimer()
		if err := client.RemoveCache(ctx, name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
