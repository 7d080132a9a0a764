// Package netlabtest adapts netlab to tests: a lab per test with cleanup, a
// warmfleet binary built once per test binary, and re-running the test
// binary inside a host's namespace to run Go client code there.
package netlabtest

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/s3fault"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// New builds a lab for tb and tears it down at cleanup (also when the test
// fails). Without root it skips, or fails in CI. Data and logs go to the
// test's temp dir; the lab logs through tb.
func New(tb testing.TB, opts netlab.Options) *netlab.Lab {
	tb.Helper()
	testenv.RequireRoot(tb)
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(tb, "%s not found (apt-get install iproute2)", tool)
		}
	}
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	if opts.S3 && opts.Versitygw == "" {
		opts.Versitygw = testenv.Bin(tb, "versitygw")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lab, err := netlab.New(ctx, opts)
	if err != nil {
		tb.Fatalf("build lab: %v", err)
	}
	tb.Cleanup(func() {
		if err := lab.Close(); err != nil {
			tb.Errorf("close lab: %v", err)
		}
		if tb.Failed() {
			LogTails(tb, opts.Dir, 80)
		}
	})
	return lab
}

// LogTails logs the last lines of every process log under dir, so a failed
// multi-host test shows what its daemons said.
func LogTails(tb testing.TB, dir string, lines int) {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".log" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		tb.Logf("==== %s (last %d of %d lines)\n%s", path, min(lines, len(all)), len(all), strings.Join(all[max(0, len(all)-lines):], "\n"))
		return nil
	})
}

// FaultFront is a netlab.Options.S3Front that puts an s3fault.Proxy in
// front of the lab's S3 server; Faults returns it.
func FaultFront(target string) (http.Handler, error) { return s3fault.New(target) }

// Faults returns the lab's S3 fault proxy (the lab was built with
// S3Front: FaultFront) or fails the test.
func Faults(tb testing.TB, lab *netlab.Lab) *s3fault.Proxy {
	tb.Helper()
	if lab.S3() == nil {
		tb.Fatal("lab has no S3 host")
	}
	fp, ok := lab.S3().Front.(*s3fault.Proxy)
	if !ok {
		tb.Fatalf("lab's S3 front is %T, want *s3fault.Proxy (build the lab with S3Front: netlabtest.FaultFront)", lab.S3().Front)
	}
	return fp
}

// tbWriter sends log lines to the test log.
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Helper()
	w.tb.Log(string(p[:len(p)-min(len(p), 1)]))
	return len(p), nil
}

// RunWithTempDir is a TestMain's body for a package that builds binaries
// once per test binary: it sets *dir to a new temporary directory, runs the
// tests, removes the directory and returns the code for os.Exit.
func RunWithTempDir(m *testing.M, pattern string, dir *string) int {
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*dir = d
	defer os.RemoveAll(d)
	return m.Run()
}

// HelperEnv names the helper a re-executed test binary should run.
const HelperEnv = "NETLAB_HELPER"

// HelperCommand returns a command that runs this test binary inside host h
// with only TestHelperProcess selected and HelperEnv=name set, plus env.
// The test package defines TestHelperProcess, which dispatches on Helper().
func HelperCommand(ctx context.Context, h *netlab.Host, name string, env ...string) *exec.Cmd {
	cmd := h.Command(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.v=false")
	cmd.Env = append(append(os.Environ(), HelperEnv+"="+name), env...)
	return cmd
}

// Helper is the helper this process should run, or "" in a normal test run.
func Helper() string { return os.Getenv(HelperEnv) }

// BuildWarmfleet builds ./cmd/warmfleet, the product, into dir and returns
// the binary; race adds -race. Build once per test binary and share the path.
func BuildWarmfleet(ctx context.Context, dir string, race bool) (string, error) {
	return build(ctx, dir, "warmfleet", race)
}

// BuildLab builds ./cmd/warmfleet-lab (the product's commands plus llmsim,
// the demo and the benchmarks) into dir, as BuildWarmfleet does.
func BuildLab(ctx context.Context, dir string, race bool) (string, error) {
	return build(ctx, dir, "warmfleet-lab", race)
}

func build(ctx context.Context, dir, name string, race bool) (string, error) {
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/"+name)...)
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", &BuildError{Pkg: "./cmd/" + name, Err: err, Output: string(out)}
	}
	return bin, nil
}

// BuildError is a failed go build with its output.
type BuildError struct {
	Pkg    string
	Err    error
	Output string
}

func (e *BuildError) Error() string {
	return "go build " + e.Pkg + ": " + e.Err.Error() + "\n" + e.Output
}
func (e *BuildError) Unwrap() error { return e.Err }
