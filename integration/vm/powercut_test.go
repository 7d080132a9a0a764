package vm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/chaos"

	"github.com/warmfleet/warmfleet/integration/vm"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// Environment knobs of the suite: how many cuts (default vm.DefaultCuts)
// and the seed of the run (default 1).
const (
	envCuts      = "WARMFLEET_VM_CUTS"
	envImageCuts = "WARMFLEET_VM_IMAGE_CUTS"
	envSeed      = "WARMFLEET_VM_SEED"
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
	runPowerCuts(t, envInt(t, envCuts, vm.DefaultCuts), 0)
}

// TestPowerCutsImages cuts the power of a guest that also runs containerd
// at seeded points of image pulls, after one model's warm-up without a
// cut; see the package documentation. A machine of its own: containerd's
// start would make every boot of TestPowerCuts' slower.
func TestPowerCutsImages(t *testing.T) {
	n := envInt(t, envImageCuts, vm.DefaultImageCuts)
	if n == 0 {
		t.Skipf("%s=0", envImageCuts)
	}
	runPowerCuts(t, 0, n)
}

func runPowerCuts(t *testing.T, cuts, imageCuts int) {
	seed := uint64(envInt(t, envSeed, 1))
	tl := findTools(t)
	wf, ag := staticBinaries(t)
	opts := vm.PowerCutOptions{
		Tools: tl, Daemon: wf, Agent: ag, S3: testenv.StartS3(t), Dir: t.TempDir(),
		Cuts: cuts, ImageCuts: imageCuts, Seed: seed, Logf: t.Logf,
	}
	rerun := fmt.Sprintf("rerun: %s=%d %s=%d -run '%s$'", envSeed, seed, envCuts, cuts, t.Name())
	if imageCuts > 0 {
		opts.Containerd = testenv.Bin(t, "containerd") // skip, or fail in CI, when it is missing
		opts.Registry = testenv.StartRegistry(t).Addr
		rerun = fmt.Sprintf("rerun: %s=%d %s=%d -run '%s$'", envSeed, seed, envImageCuts, imageCuts, t.Name())
	}
	t.Logf("seed %d, %d cuts in model warm-ups, %d in image pulls (%s)", seed, cuts, imageCuts, rerun)
	res, err := vm.RunPowerCuts(t.Context(), opts)
	if err != nil {
		t.Fatalf("%v (%s)", err, rerun)
	}
	for _, v := range res.Violations {
		t.Error(v)
	}
	for _, c := range []struct {
		what string
		vm.CutCounts
	}{{"model warm-ups", res.CutCounts}, {"image pulls", res.Images}} {
		if c.CorruptReady > 0 || c.Lost > 0 {
			t.Errorf("%s: %d corrupt ready, %d entries lost: both must be 0 (%s)", c.what, c.CorruptReady, c.Lost, rerun)
		}
	}
}

// TestBenchChaosPowerCuts runs `warmfleet-lab bench chaos` with its
// cheapest scenario and one power cut and checks what it prints: the
// scenario passed, and the cut was made in a virtual machine and
// recovered from, with nothing corrupt.
func TestBenchChaosPowerCuts(t *testing.T) {
	testenv.RequireRoot(t) // the scenario's network namespaces
	findTools(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	// Static, as the guest needs: the bench runs this binary in the VM.
	lab, err := vm.BuildStatic(ctx, testenv.RepoRoot(), "./cmd/warmfleet-lab", binDir)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	// No image cuts: TestPowerCutsImages makes them, and a second machine
	// here would cost as much again; the JSON must say why there are none.
	cmd := exec.CommandContext(ctx, lab, "bench", "chaos", "--scenario", "hostile-keys", "--vm-cuts", "1", "--vm-image-cuts", "0", "-o", "json", "-v")
	cmd.Dir, cmd.Stdout, cmd.Stderr = testenv.RepoRoot(), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench chaos: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), tail(stderr.String(), 8000))
	}
	var res chaos.Result
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		t.Fatalf("bench chaos -o json: %v\n%s", err, stdout.String())
	}
	t.Logf("scenarios %+v, power cuts %+v", res.Scenarios, res.PowerCuts)
	if len(res.Scenarios) != 1 || res.Scenarios[0].Name != "hostile-keys" || !res.Scenarios[0].Passed {
		t.Errorf("scenarios %+v: want hostile-keys, passed", res.Scenarios)
	}
	pc := res.PowerCuts
	if pc == nil {
		t.Fatalf("no power_cuts in the JSON (skipped: %q)", res.PowerCutsSkipped)
	}
	if pc.Cuts != 1 || pc.Recovered != 1 || pc.CorruptReady != 0 || pc.LostEntries != 0 || pc.Seconds <= 0 || pc.SecondsPerCut <= 0 || pc.Error != "" {
		t.Errorf("power_cuts %+v: want 1 cut, 1 recovered, 0 corrupt ready, 0 entries lost, its seconds, no error", *pc)
	}
	if res.ImagePowerCuts != nil || res.ImagePowerCutsSkipped != "--vm-image-cuts 0" {
		t.Errorf("image_power_cuts %+v, skipped %q: want none, skipped for --vm-image-cuts 0", res.ImagePowerCuts, res.ImagePowerCutsSkipped)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
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
