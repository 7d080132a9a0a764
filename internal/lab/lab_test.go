package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/cli"
)

// TestClockSkewEnv: WARMFLEET_LAB_CLOCK_SKEW sets the daemon's clock that
// far off; a bad value is a usage error naming it, before any command runs.
func TestClockSkewEnv(t *testing.T) {
	env := func(v string) *cli.Env {
		return &cli.Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Getenv: func(k string) string {
			if k == ClockSkewEnv {
				return v
			}
			return ""
		}}
	}
	e := env("-7m")
	if err := skewClock(e); err != nil || e.Clock == nil {
		t.Fatalf("skewClock(-7m) = %v, clock set %v", err, e.Clock != nil)
	}
	if off := time.Until(e.Clock()); off > -7*time.Minute || off < -7*time.Minute-time.Minute {
		t.Fatalf("clock is %v off, want -7m", off)
	}
	if e := env(""); skewClock(e) != nil || e.Clock != nil {
		t.Fatal("no skew set a clock")
	}
	bad := env("soon")
	if code := Run(context.Background(), []string{"version"}, bad); code != 2 || !strings.Contains(bad.Stderr.(*bytes.Buffer).String(), ClockSkewEnv) {
		t.Fatalf("bad skew: exit %d, stderr %q; want 2 naming %s", code, bad.Stderr, ClockSkewEnv)
	}
}

// TestCPUProfileEnv: WARMFLEET_LAB_CPUPROFILE makes a daemon profile itself
// into cpu-PID.pprof in that directory until it stops; unset, nothing is
// written; a directory that cannot take the file is an error naming it.
func TestCPUProfileEnv(t *testing.T) {
	dir := t.TempDir()
	stop, err := startCPUProfile(dir)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	st, err := os.Stat(filepath.Join(dir, fmt.Sprintf("cpu-%d.pprof", os.Getpid())))
	if err != nil || st.Size() == 0 {
		t.Fatalf("profile after stop: %v, %v; want a non-empty file", st, err)
	}
	stop, err = startCPUProfile("")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := startCPUProfile(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), CPUProfileEnv) {
		t.Fatalf("profile into a missing directory: %v, want an error naming %s", err, CPUProfileEnv)
	}
}
