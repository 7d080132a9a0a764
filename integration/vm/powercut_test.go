package vm_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/vm"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// Environment knobs of the suite: how many cuts (default vm.DefaultCuts)
// and the seed of the run (default 1).
const (
	envCuts = "WARMFLEET_VM_CUTS"
	envSeed = "WARMFLEET_VM_SEED"
)

// binDir holds the static binaries built once per test binary.
var binDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "warmfleet-vm-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

var (
	buildOnce           sync.Once
	warmfleetBin, agent string
	buildErr            error
)

// staticBinaries builds cmd/warmfleet and the guest agent once.
func staticBinaries(t *testing.T) (string, string) {
	t.Helper()
	buildOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		root := testenv.RepoRoot()
		if warmfleetBin, buildErr = vm.BuildStatic(ctx, root, "./cmd/warmfleet", binDir); buildErr != nil {
			return
		}
		agent, buildErr = vm.BuildStatic(ctx, root, "./integration/vm/guestagent", binDir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return warmfleetBin, agent
}

// findTools finds what the suite runs, or skips (fails in CI) naming the
// Debian package that brings it.
func findTools(t *testing.T) vm.Tools {
	t.Helper()
	tl, err := vm.FindTools()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	testenv.Bin(t, "versitygw") // skip, or fail in CI, when it is missing
	return tl
}

// TestPowerCuts cuts the guest's power at seeded points of model
// warm-ups, including their publish step, and after each cut boots the
// guest again on what the disk kept; see the package documentation.
func TestPowerCuts(t *testing.T) {
	cuts := envInt(t, envCuts, vm.DefaultCuts)
	seed := uint64(envInt(t, envSeed, 1))
	tl := findTools(t)
	wf, ag := staticBinaries(t)
	t.Logf("seed %d, %d cuts (%s, %s)", seed, cuts, envSeed, envCuts)
	res, err := vm.RunPowerCuts(t.Context(), vm.PowerCutOptions{
		Tools: tl, Daemon: wf, Agent: ag, S3: testenv.StartS3(t), Dir: t.TempDir(),
		Cuts: cuts, Seed: seed, Logf: t.Logf,
	})
	if err != nil {
		t.Fatalf("%v (rerun: %s=%d %s=%d)", err, envSeed, seed, envCuts, cuts)
	}
	for _, v := range res.Violations {
		t.Error(v)
	}
	if res.CorruptReady > 0 || res.Lost > 0 {
		t.Errorf("%d corrupt ready, %d entries lost: both must be 0 (rerun: %s=%d %s=%d)", res.CorruptReady, res.Lost, envSeed, seed, envCuts, cuts)
	}
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a number >= 0", name, s)
	}
	return n
}
