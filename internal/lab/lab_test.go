package lab

import (
	"bytes"
	"context"
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
