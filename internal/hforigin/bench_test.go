package hforigin

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/hubserver"
	"github.com/warmfleet/warmfleet/spec"
)

const benchFiles, benchFileSize = 4, 64 << 20

// benchHubEnv makes the test binary a Hub for BenchmarkDownload (see
// TestBenchHubProcess).
const benchHubEnv = "WARMFLEET_BENCH_HUB"

// BenchmarkDownload fetches the same model (benchFiles LFS files of
// benchFileSize bytes, through the resolve redirect to the CDN server) with
// this client (files in parallel, each in parallel parts, verified by
// sha256) and with one curl -L per file, all at once (the plain-HTTP
// baseline), with and without sha256sum after it. Compare the MB/s of
// hforigin with curl (goal: at least as fast) and curl+sha256sum (the same
// job); run with -benchtime=1x -count=N for medians.
//
// The Hub runs in a process of its own (this test binary re-executed), as
// a real one would: served from inside the benchmark's process, it would
// share the Go scheduler's GOMAXPROCS with this client but not with curl,
// and the comparison would measure that instead of the download path.
func BenchmarkDownload(b *testing.B) {
	endpoint := startBenchHub(b)
	c, err := New(Options{Endpoint: endpoint})
	if err != nil {
		b.Fatal(err)
	}
	objs, err := c.ListHF(b.Context(), spec.HFURL{Repo: "org/bench", Revision: "main"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hforigin", func(b *testing.B) {
		b.SetBytes(benchFiles * benchFileSize)
		allFiles(b, objs, func(dir string, o s3origin.Object) error {
			f, err := os.Create(filepath.Join(dir, o.Path))
			if err != nil {
				return err
			}
			defer f.Close()
			return c.Download(b.Context(), o, f, s3origin.Plan{})
		})
	})
	// curl alone does not verify; "curl+sha256sum" is the same job as ours.
	for _, check := range []bool{false, true} {
		name := map[bool]string{false: "curl", true: "curl+sha256sum"}[check]
		b.Run(name, func(b *testing.B) {
			if _, err := exec.LookPath("curl"); err != nil {
				b.Skip("no curl")
			}
			b.SetBytes(benchFiles * benchFileSize)
			allFiles(b, objs, func(dir string, o s3origin.Object) error {
				dst := filepath.Join(dir, o.Path)
				cmd := exec.Command("curl", "-sSfL", "-o", dst, c.resolveURL(o))
				if check {
					cmd = exec.Command("sh", "-c", `curl -sSfL -o "$1" "$2" && echo "$3  $1" | sha256sum -c --status`, "sh", dst, c.resolveURL(o), o.ETag)
				}
				if out, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("%s: %w: %s", name, err, out)
				}
				return nil
			})
		})
	}
}

// startBenchHub runs the bench's Hub in a child process and returns its
// endpoint; the child ends when the benchmark does (its stdin closes).
func startBenchHub(b *testing.B) string {
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchHubProcess$")
	cmd.Env = append(os.Environ(), benchHubEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("bench hub: %v", err)
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("bench hub: no endpoint: %v", err)
	}
	return strings.TrimSpace(line)
}

// TestBenchHubProcess is not a test: it is BenchmarkDownload's Hub, run in
// a child process. It prints its endpoint and serves until stdin closes.
func TestBenchHubProcess(t *testing.T) {
	if os.Getenv(benchHubEnv) == "" {
		t.Skip("BenchmarkDownload's Hub process")
	}
	hub := hubserver.New(t)
	files := map[string]hubserver.File{}
	for i := range benchFiles {
		files[fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, benchFiles)] = hubserver.File{Data: randBytes(uint64(i), benchFileSize), LFS: true}
	}
	hub.Push("org/bench", "main", files)
	fmt.Println(hub.Endpoint())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// allFiles runs fetch for every object at once into a fresh directory, once
// per benchmark iteration.
func allFiles(b *testing.B, objs []s3origin.Object, fetch func(dir string, o s3origin.Object) error) {
	for b.Loop() {
		dir := b.TempDir()
		var g errgroup.Group
		for _, o := range objs {
			g.Go(func() error { return fetch(dir, o) })
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
	}
}
