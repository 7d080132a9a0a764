package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/internal/testutil/synthmodel"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

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
		n, err := bytesize.Parse(v)
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
	if err := wait.Poll(b, func() error { _, err := client.Node(ctx); return err }); err != nil {
		b.Fatalf("daemon API: %v\n%s", err, logBuf.String())
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
