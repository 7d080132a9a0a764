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

// testingImporters may import the standard "testing" package in the
// product: github.com/anacrolix/torrent (the BitTorrent origin) and its log
// package call testing.Testing() in init to pick debug defaults under go
// test, which links the package but runs none of it. No other importer is
// tolerated, nor any other forbidden package through them.
var testingImporters = []string{"github.com/anacrolix/"}

// TestProductLinksNoLab asserts, from `go list -deps`, that the product
// binary links none of the forbidden packages.
func TestProductLinksNoLab(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 100 {
		t.Fatalf("go list -deps listed only %d packages: %q", len(lines), out)
	}
	importers := map[string][]string{}
	for _, line := range lines {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			importers[imp] = append(importers[imp], f[0])
		}
	}
	for _, line := range lines {
		dep := strings.Fields(line)[0]
		if bad, why := isForbidden(dep); bad && !(dep == "testing" && tolerated(importers[dep])) {
			t.Errorf("cmd/warmfleet links %s (%s), imported by %q: move what imports it to cmd/warmfleet-lab", dep, why, importers[dep])
		}
	}
}

// tolerated tells whether every importer is one of testingImporters.
func tolerated(importers []string) bool {
	for _, imp := range importers {
		ok := false
		for _, p := range testingImporters {
			ok = ok || strings.HasPrefix(imp, p)
		}
		if !ok {
			return false
		}
	}
	return len(importers) > 0
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

func TestTolerated(t *testing.T) {
	if !tolerated([]string{"github.com/anacrolix/torrent", "github.com/anacrolix/log"}) {
		t.Error("anacrolix's imports of testing not tolerated")
	}
	if tolerated([]string{"github.com/anacrolix/torrent", "github.com/warmfleet/warmfleet/daemon"}) || tolerated(nil) {
		t.Error("a warmfleet package importing testing tolerated")
	}
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
