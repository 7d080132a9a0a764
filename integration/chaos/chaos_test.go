package chaos_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/chaos"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// binDir holds the warmfleet binary built once for this test binary.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(netlabtest.RunWithTempDir(m, "warmfleet-chaos-bin-", &binDir))
}

// TestChaos runs every scenario of the table, each in a lab of its own,
// with the shared checks after each.
func TestChaos(t *testing.T) {
	testenv.RequireRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	// The daemons run without the race detector even under -race: it
	// multiplies their CPU several times, and on a two-core CI machine the
	// gossip of a race-enabled fleet times out and flaps, which is not the
	// fault a scenario stages. The runner and its checks still run under
	// -race; the daemons' races are the other integration tests' job.
	// The lab binary runs what the product has no hook for: a daemon with
	// a skewed clock, the simulated inference engines. The two builds share
	// most packages, so they run side by side.
	var bin, labBin string
	var labErr error
	var built sync.WaitGroup
	built.Go(func() { labBin, labErr = netlabtest.BuildLab(ctx, binDir, false) })
	bin, err := netlabtest.BuildWarmfleet(ctx, binDir, false)
	built.Wait()
	if err = errors.Join(err, labErr); err != nil {
		t.Fatal(err)
	}
	versitygw := testenv.Bin(t, "versitygw")
	for _, sc := range chaos.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			if sc.KnownBug != "" {
				t.Skipf("known bug (warmfleet-lab bench chaos --scenario %s shows it): %s", sc.Name, sc.KnownBug)
			}
			dir := t.TempDir()
			res := chaos.RunScenario(t.Context(), chaos.Options{
				Bin: bin, LabBin: labBin, Versitygw: versitygw, Dir: dir,
				Logger: slog.New(slog.NewTextHandler(tbWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
			}, sc)
			t.Logf("%s: passed %v, %d files verified, %d corrupt ready, %d entries lost, %.1f s, figures %v",
				res.Name, res.Passed, res.FilesVerified, res.CorruptReady, res.LostEntries, res.Seconds, res.Figures)
			if !res.Passed {
				netlabtest.LogTails(t, dir, 60)
				t.Fatalf("fault: %s\nexpected: %s\n%s", sc.Fault, sc.Expect, res.Error)
			}
			if res.FilesVerified == 0 && !sc.NoFiles {
				t.Fatalf("no ready file was verified: the scenario checked nothing")
			}
		})
	}
}

// TestSelect finds scenarios by name and refuses unknown names.
func TestSelect(t *testing.T) {
	all, err := chaos.Select()
	if err != nil || len(all) != len(chaos.Scenarios()) {
		t.Fatalf("Select() = %d scenarios, %v; want all %d", len(all), err, len(chaos.Scenarios()))
	}
	one, err := chaos.Select(all[len(all)-1].Name)
	if err != nil || len(one) != 1 || one[0].Name != all[len(all)-1].Name {
		t.Fatalf("Select(%q) = %v, %v", all[len(all)-1].Name, one, err)
	}
	if _, err := chaos.Select("no-such-scenario"); err == nil || !strings.Contains(err.Error(), "no-such-scenario") {
		t.Fatalf("Select(unknown) err = %v, want one naming it", err)
	}
	seen := map[string]bool{}
	for _, sc := range all {
		if sc.Name == "" || sc.Fault == "" || sc.Expect == "" || sc.Run == nil || seen[sc.Name] {
			t.Errorf("scenario %q: want a unique name, a fault, an expectation and a Run", sc.Name)
		}
		seen[sc.Name] = true
	}
}

// tbWriter sends log lines to the test log.
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
