package main

import (
	"os/exec"
	"strings"
	"testing"
)

// forbidden are the packages the product binary must not link: the test
// framework, the test support and the lab (demo, benchmarks, simulated
// backends, network-namespace harness, embedded S3 server). They belong in
// cmd/warmfleet-lab; a GPU node's daemon ships without them.
var forbidden = []struct{ prefix, why string }{
	{"testing", "the test framework"},
	{"github.com/warmfleet/warmfleet/integration", "the multi-host harness and fleet benchmark"},
	{"github.com/warmfleet/warmfleet/internal/lab", "the lab: its commands, the S3 benchmark, the embedded S3 server"},
	{"github.com/warmfleet/warmfleet/internal/testutil", "test support: real services, test images, synthetic models, S3 uploads"},
	{"github.com/warmfleet/warmfleet/router/llmsim", "the simulated inference backend"},
	{"github.com/warmfleet/warmfleet/router/bench", "the router benchmark"},
	{"github.com/johannesboyne/gofakes3", "the embedded S3 server's engine"},
}

// TestProductLinksNoLab asserts, from `go list -deps`, that the product
// binary links none of the forbidden packages.
func TestProductLinksNoLab(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps listed only %d packages: %q", len(deps), out)
	}
	for _, dep := range deps {
		if bad, why := isForbidden(dep); bad {
			t.Errorf("cmd/warmfleet links %s (%s): move what imports it to cmd/warmfleet-lab", dep, why)
		}
	}
}

// isForbidden tells whether pkg is, or is inside, a forbidden package.
func isForbidden(pkg string) (bool, string) {
	for _, f := range forbidden {
		if pkg == f.prefix || strings.HasPrefix(pkg, f.prefix+"/") {
			return true, f.why
		}
	}
	return false, ""
}

func TestIsForbidden(t *testing.T) {
	for pkg, want := range map[string]bool{
		"testing":        true,
		"testing/fstest": true,
		"testingfoo":     false,
		"github.com/warmfleet/warmfleet/integration/netlab":           true,
		"github.com/warmfleet/warmfleet/router/bench":                 true,
		"github.com/warmfleet/warmfleet/router/benchmark":             false,
		"github.com/warmfleet/warmfleet/router/balance":               false,
		"github.com/johannesboyne/gofakes3/backend/s3mem":             true,
		"github.com/warmfleet/warmfleet/internal/s3origin":            false,
		"github.com/warmfleet/warmfleet/internal/lab/s3bench":         true,
		"github.com/warmfleet/warmfleet/internal/lab/s3embed":         true,
		"github.com/warmfleet/warmfleet/internal/testutil/testenv":    true,
		"github.com/warmfleet/warmfleet/internal/testutil/synthmodel": true,
		"github.com/warmfleet/warmfleet/internal/labs":                false,
	} {
		if got, _ := isForbidden(pkg); got != want {
			t.Errorf("isForbidden(%q) = %v, want %v", pkg, got, want)
		}
	}
}
