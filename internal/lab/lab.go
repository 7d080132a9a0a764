// Package lab is the warmfleet-lab command line: the demo, a local S3
// server with synthetic models (s3), the benchmarks
// (bench s3, fleet, router, chaos) and the simulated inference server (llmsim),
// on top of every command of the product (internal/cli), which the
// benchmarks run as the system under test (bench s3 and bench fleet start
// this binary's own `daemon`). It is what needs test support (an embedded
// S3 server, synthetic models, network namespaces), kept out of the
// product binary, cmd/warmfleet: the product must never import this
// package, and cmd/warmfleet's dependency test checks it does not.
//
// One hook exists only here: WARMFLEET_LAB_CLOCK_SKEW (a Go duration such
// as 5m or -7m) runs this binary's daemon with its wall clock that far off
// (the clock it stamps desired-state writes and inventory versions with),
// as the chaos suite's clock-skew scenario needs: network namespaces share
// the host's clock, so the skew cannot be made outside the process. The
// product binary has no such setting.
//
// Another, WARMFLEET_LAB_CPUPROFILE (a directory), makes this binary's
// daemon write a Go CPU profile of its whole life to cpu-PID.pprof there,
// so a bench can tell where a host's CPU goes (bench fleet --cpu-profile
// sets it for every daemon). The product binary has no such setting either.
package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/warmfleet/warmfleet/internal/cli"
)

// ClockSkewEnv names the environment variable that skews the daemon's
// wall clock in this binary (see the package doc).
const ClockSkewEnv = "WARMFLEET_LAB_CLOCK_SKEW"

// CPUProfileEnv names the environment variable with the directory a
// daemon of this binary writes its CPU profile to (see the package doc).
const CPUProfileEnv = "WARMFLEET_LAB_CPUPROFILE"

// Run runs the lab command named by args[0], or a product command, and
// returns the process exit code.
func Run(ctx context.Context, args []string, e *cli.Env) int {
	if err := skewClock(e); err != nil {
		fmt.Fprintf(e.Stderr, "warmfleet-lab: %v\n", err)
		return 2
	}
	if len(args) > 0 && args[0] == "daemon" {
		stop, err := startCPUProfile(e.Getenv(CPUProfileEnv))
		if err != nil {
			fmt.Fprintf(e.Stderr, "warmfleet-lab: %v\n", err)
			return 2
		}
		defer stop()
	}
	return cli.Dispatch(ctx, "warmfleet-lab", commands(), args, e)
}

// startCPUProfile profiles this process into dir/cpu-PID.pprof until the
// returned stop is called; with dir empty it does nothing.
func startCPUProfile(dir string) (stop func(), err error) {
	if dir == "" {
		return func() {}, nil
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("cpu-%d.pprof", os.Getpid())))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CPUProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", CPUProfileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// skewClock sets e.Clock from ClockSkewEnv, if set.
func skewClock(e *cli.Env) error {
	v := e.Getenv(ClockSkewEnv)
	if v == "" {
		return nil
	}
	skew, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("%s=%q: %w", ClockSkewEnv, v, err)
	}
	e.Clock = func() time.Time { return time.Now().Add(skew) }
	return nil
}

func commands() []cli.Command {
	return append([]cli.Command{
		{Name: "demo", Summary: "run a 4-node fleet on loopback: S3 once, swarm, router strategies, a late node", Run: runDemo},
		{Name: "s3", Summary: "serve a local S3 with synthetic models and print the AWS_* settings", Run: runS3},
		{Name: "bench", Summary: "run a benchmark: s3, fleet, router, chaos", Run: runBench},
		{Name: "llmsim", Summary: "run one simulated LLM inference backend", Run: runLLMSim},
		{Name: "vm-agent", Summary: "the guest agent inside bench chaos's power-cut virtual machines (not for use on a host)", Run: runVMAgent},
	}, cli.Commands()...)
}
