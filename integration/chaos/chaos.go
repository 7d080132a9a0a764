// Package chaos is warmfleet's fault suite: a table of scenarios, each a
// fault done to a real fleet (daemons in network namespaces of a netlab lab,
// a real S3 server) with the outcome it must have, and one runner shared by
// the test (go test ./integration/chaos) and the lab command
// (warmfleet-lab bench chaos), so both run the same code.
//
// A scenario builds its own lab, starts the daemons it needs, does its fault
// and checks its own outcome (the fleet finishes, a peer is banned, S3 read
// about once...). After every scenario, passed or not, one checker looks at
// every daemon still running: every file of every cache it reports ready
// has the SHA-256 of its source object and nothing else lies in a ready
// directory (no partial file is ready), and every desired-state entry the
// scenario added is still known (none lost). Then the lab is closed and
// the checker makes sure that no process and no network namespace is left.
//
// The lab needs root (see integration/netlab).
package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
)

// Scenario is one fault and what must follow it.
type Scenario struct {
	// Name identifies the scenario (bench chaos --scenario NAME).
	Name string
	// Fault says what goes wrong; Expect what must happen then.
	Fault, Expect string
	// Lab is the lab the scenario runs in; Dir and Logger come from
	// Options.
	Lab netlab.Options
	// NoFiles marks a scenario that caches nothing (the router's): the
	// shared checks have no file to verify.
	NoFiles bool
	// KnownBug, if set, describes a bug of the daemon this scenario shows
	// today: the test skips the scenario, naming the bug, until it is
	// fixed; the bench runs it and reports it failed.
	KnownBug string
	// Run starts the fleet, does the fault and checks the scenario's own
	// outcome; the shared checks follow it.
	Run func(ctx context.Context, f *Fleet) error
}

// Options say how to run scenarios.
type Options struct {
	// Bin is the binary whose `daemon` command the hosts run (warmfleet, or
	// warmfleet-lab, which has the same commands).
	Bin string
	// LabBin is the warmfleet-lab binary, which scenarios need for its
	// test hooks (a daemon with a skewed clock) and its simulated
	// inference engines (llmsim); such scenarios fail without it.
	LabBin string
	// Versitygw is the S3 server binary.
	Versitygw string
	// Dir holds each scenario's lab (a subdirectory per scenario); empty:
	// temporary directories.
	Dir string
	// Timeout bounds one scenario; default 2 minutes.
	Timeout time.Duration
	// Logger gets progress; default discards.
	Logger *slog.Logger
	// Long runs the long variants: 10k connections for the router, a
	// minute of flapping (the test suite runs the short ones).
	Long bool
}

// Result is what bench chaos prints.
type Result struct {
	Scenarios []ScenarioResult `json:"scenarios"`
	// PowerCuts are the figures of power loss in virtual machines
	// (integration/vm), when they ran; PowerCutsSkipped says why not.
	PowerCuts        *PowerCuts `json:"power_cuts,omitempty"`
	PowerCutsSkipped string     `json:"power_cuts_skipped,omitempty"`
	// ImagePowerCuts are the same figures of cuts in image pulls, in a
	// virtual machine that also runs containerd (its images are what
	// Recovered, CorruptReady and LostEntries count: an image reported
	// ready must be complete in containerd).
	ImagePowerCuts        *PowerCuts `json:"image_power_cuts,omitempty"`
	ImagePowerCutsSkipped string     `json:"image_power_cuts_skipped,omitempty"`
}

// PowerCuts are the figures of power loss in virtual machines.
type PowerCuts struct {
	// Cuts were made; Recovered of them were followed by the cut model
	// ready and whole; CorruptReady counts models reported ready (or
	// linked as current) with a missing, short, wrong or extra file, and
	// LostEntries caches acknowledged before a cut and unknown after it:
	// both must be 0.
	Cuts         int     `json:"cuts"`
	Recovered    int     `json:"recovered"`
	CorruptReady int     `json:"corrupt_ready"`
	LostEntries  int     `json:"lost_entries"`
	Seed         uint64  `json:"seed"`
	Seconds      float64 `json:"seconds"`
	// SecondsPerCut is the time one cut took, from its warm-up's (pull's)
	// start to the end of its recovery, on average.
	SecondsPerCut float64 `json:"seconds_per_cut"`
	Error         string  `json:"error,omitempty"`
}

// ScenarioResult is the outcome of one scenario.
type ScenarioResult struct {
	Name   string `json:"name"`
	Passed bool   `json:"passed"`
	// FilesVerified counts ready files (on every running daemon) whose
	// SHA-256 matched their source.
	FilesVerified int `json:"files_verified"`
	// CorruptReady counts ready files that did not, were missing, or were
	// not part of the source at all; it must be 0.
	CorruptReady int `json:"corrupt_ready"`
	// LostEntries counts desired-state entries a running daemon no longer
	// knows; it must be 0.
	LostEntries int     `json:"lost_entries"`
	Seconds     float64 `json:"seconds"`
	// Figures are the scenario's own measurements (bans, refusals,
	// goroutines before and after...), by name.
	Figures map[string]float64 `json:"figures,omitempty"`
	// Error says why the scenario failed.
	Error string `json:"error,omitempty"`
}

// WriteJSON writes r as indented JSON.
func (r Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes r as a table.
func (r Result) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-20s %-6s %14s %13s %12s %8s\n", "scenario", "passed", "files_verified", "corrupt_ready", "lost_entries", "seconds")
	for _, s := range r.Scenarios {
		fmt.Fprintf(&b, "%-20s %-6v %14d %13d %12d %8.1f\n", s.Name, s.Passed, s.FilesVerified, s.CorruptReady, s.LostEntries, s.Seconds)
		if len(s.Figures) > 0 {
			var figs []string
			for _, k := range slices.Sorted(maps.Keys(s.Figures)) {
				figs = append(figs, fmt.Sprintf("%s=%.4g", k, s.Figures[k]))
			}
			fmt.Fprintf(&b, "  figures: %s\n", strings.Join(figs, " "))
		}
		if s.Error != "" {
			fmt.Fprintf(&b, "  error: %s\n", s.Error)
		}
	}
	for _, c := range []struct {
		what    string
		pc      *PowerCuts
		skipped string
	}{{"power cuts", r.PowerCuts, r.PowerCutsSkipped}, {"power cuts in image pulls", r.ImagePowerCuts, r.ImagePowerCutsSkipped}} {
		switch pc := c.pc; {
		case pc != nil:
			fmt.Fprintf(&b, "%s: %d cut, %d recovered, %d corrupt ready, %d entries lost in %.1f s, %.1f s per cut (seed %d)\n",
				c.what, pc.Cuts, pc.Recovered, pc.CorruptReady, pc.LostEntries, pc.Seconds, pc.SecondsPerCut, pc.Seed)
			if pc.Error != "" {
				fmt.Fprintf(&b, "  error: %s\n", pc.Error)
			}
		case c.skipped != "":
			fmt.Fprintf(&b, "%s: skipped: %s\n", c.what, c.skipped)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Select returns the scenarios named, in table order, or all of them when
// names is empty; an unknown name is an error.
func Select(names ...string) ([]Scenario, error) {
	all := Scenarios()
	if len(names) == 0 {
		return all, nil
	}
	var out []Scenario
	for _, n := range names {
		found := false
		for _, sc := range all {
			if sc.Name == n {
				out, found = append(out, sc), true
			}
		}
		if !found {
			return nil, fmt.Errorf("chaos: no scenario %q (have %s)", n, strings.Join(scenarioNames(all), ", "))
		}
	}
	return out, nil
}

func scenarioNames(scs []Scenario) []string {
	var names []string
	for _, sc := range scs {
		names = append(names, sc.Name)
	}
	return names
}

// Run runs the scenarios one after the other; a failed scenario does not
// stop the others. The error is only for a run that could not start.
func Run(ctx context.Context, opts Options, scs []Scenario) (Result, error) {
	if opts.Bin == "" {
		return Result{}, errors.New("chaos: no daemon binary given")
	}
	var res Result
	for _, sc := range scs {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		res.Scenarios = append(res.Scenarios, RunScenario(ctx, opts, sc))
	}
	return res, nil
}

// RunScenario runs one scenario in a lab of its own, then the shared
// checks, and closes the lab.
func RunScenario(ctx context.Context, opts Options, sc Scenario) ScenarioResult {
	start := time.Now()
	res := ScenarioResult{Name: sc.Name}
	err := runScenario(ctx, opts, sc, &res)
	res.Seconds = time.Since(start).Seconds()
	res.Passed = err == nil && res.CorruptReady == 0 && res.LostEntries == 0
	if err != nil {
		res.Error = err.Error()
	} else if !res.Passed {
		res.Error = fmt.Sprintf("%d corrupt files ready, %d desired entries lost", res.CorruptReady, res.LostEntries)
	}
	return res
}

func runScenario(ctx context.Context, opts Options, sc Scenario, res *ScenarioResult) (err error) {
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("scenario", sc.Name)
	lopts := sc.Lab
	lopts.Logger, lopts.Versitygw = log, opts.Versitygw
	if opts.Dir != "" {
		lopts.Dir = filepath.Join(opts.Dir, sc.Name)
		if err := os.MkdirAll(lopts.Dir, 0o755); err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
	}
	lab, err := netlab.New(ctx, lopts)
	if err != nil {
		return fmt.Errorf("chaos: build lab: %w", err)
	}
	keyDir, err := os.MkdirTemp("", "warmfleet-chaos-key-")
	if err != nil {
		return errors.Join(fmt.Errorf("chaos: %w", err), lab.Close())
	}
	defer os.RemoveAll(keyDir)
	f := &Fleet{Lab: lab, Bin: opts.Bin, LabBin: opts.LabBin, Long: opts.Long, Log: log, figures: map[string]float64{}, Key: filepath.Join(keyDir, "cluster.key"), desired: map[string][]netlab.Model{}}
	if err := netlab.WriteClusterKey(f.Key); err != nil {
		return errors.Join(err, lab.Close())
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	log.Info("chaos: scenario starts", "fault", sc.Fault)
	runErr := sc.Run(sctx, f)
	if runErr != nil {
		runErr = fmt.Errorf("%s: %w", sc.Name, runErr)
	}
	// The shared checks get their own time: a scenario that ran out of
	// its own still gets its files checked.
	cctx, ccancel := context.WithTimeout(ctx, time.Minute)
	defer ccancel()
	checkErr := f.checkReady(cctx, res)
	if len(f.figures) > 0 {
		res.Figures = f.figures
	}
	return errors.Join(runErr, checkErr, f.closeAndCheck())
}
