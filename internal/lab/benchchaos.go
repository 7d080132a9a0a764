package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/integration/chaos"
	"github.com/warmfleet/warmfleet/integration/vm"
	"github.com/warmfleet/warmfleet/integration/vm/agent"
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// runBenchChaos runs the chaos suite (integration/chaos): each scenario a
// fault done to a fleet of network-namespace hosts running this binary's
// daemon, with the shared checks after it; it prints one line of figures
// per scenario. It needs root. Then it cuts the power of a virtual machine
// running this binary's daemon --vm-cuts times in model warm-ups
// (integration/vm), and of another that also runs containerd
// --vm-image-cuts times in image pulls, unless the machine lacks qemu, a
// kernel or busybox (containerd or docker-registry for the second), which
// it says instead of a figure. It exits 1 if a scenario failed or a power
// cut left a corrupt ready file or image or lost an entry.
func runBenchChaos(ctx context.Context, e *cli.Env, args []string) error {
	fs := cli.NewFlagSet(e, "bench chaos")
	var names cli.ListFlag
	fs.Var(&names, "scenario", "run only this scenario (repeatable; default: all): "+fmt.Sprint(scenarioNames()))
	timeout := fs.Duration("timeout", 2*time.Minute, "time one scenario may take")
	output := fs.String("o", "table", "output format: table or json")
	versitygw := fs.String("versitygw", "", "versitygw binary for the S3 host (default: ./bin/versitygw, else PATH)")
	dir := fs.String("dir", "", "keep each scenario's data and daemon logs here (default: temporary directories, removed)")
	verbose := fs.Bool("v", false, "log progress to stderr")
	long := fs.Bool("long", false, "run the long variants: 10k concurrent connections on the router, a minute of flapping")
	vmCuts := fs.Int("vm-cuts", vm.DefaultCuts, "power cuts in a qemu virtual machine after the scenarios (0: none)")
	vmImageCuts := fs.Int("vm-image-cuts", vm.DefaultImageCuts, "power cuts in image pulls, in a qemu virtual machine that also runs containerd (Debian's), from a docker-registry on this host (0: none)")
	vmSeed := fs.Uint64("vm-seed", 1, "seed of the power cuts' points and crash modes (the same seed cuts at the same places)")
	if err := cli.ParseFlags(fs, e, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError("unexpected arguments %q", fs.Args())
	}
	if *output != "table" && *output != "json" {
		return cli.UsageError("-o %q: want table or json", *output)
	}
	if *timeout <= 0 {
		return cli.UsageError("--timeout %v: want more than 0", *timeout)
	}
	if *vmCuts < 0 || *vmCuts > 1000 {
		return cli.UsageError("--vm-cuts %d: want 0 to 1000", *vmCuts)
	}
	if *vmImageCuts < 0 || *vmImageCuts > 1000 {
		return cli.UsageError("--vm-image-cuts %d: want 0 to 1000", *vmImageCuts)
	}
	scs, err := chaos.Select(names...)
	if err != nil {
		return cli.UsageError("--scenario: %v", err)
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary for the daemons: %w", err)
	}
	*versitygw = labVersitygw(*versitygw)
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	res, err := chaos.Run(ctx, chaos.Options{
		Bin: bin, LabBin: bin, Versitygw: *versitygw, Dir: *dir, Timeout: *timeout, Long: *long,
		Logger: slog.New(slog.NewTextHandler(e.Stderr, &slog.HandlerOptions{Level: level})),
	}, scs)
	if err != nil {
		return err
	}
	pcr := powerCutRun{bin: bin, versitygw: *versitygw, seed: *vmSeed, verbose: *verbose}
	var vmErr, imageErr error
	res.PowerCuts, res.PowerCutsSkipped, vmErr = pcr.run(ctx, e, *vmCuts, false)
	res.ImagePowerCuts, res.ImagePowerCutsSkipped, imageErr = pcr.run(ctx, e, *vmImageCuts, true)
	vmErr = errors.Join(vmErr, imageErr)
	if *output == "json" {
		err = res.WriteJSON(e.Stdout)
	} else {
		err = res.WriteTable(e.Stdout)
	}
	if err != nil {
		return err
	}
	for _, s := range res.Scenarios {
		if !s.Passed {
			return fmt.Errorf("bench chaos: scenario %s failed: %s", s.Name, s.Error)
		}
	}
	return vmErr
}

// powerCutRun is how bench chaos runs power cuts in a virtual machine.
type powerCutRun struct {
	bin, versitygw string
	seed           uint64
	verbose        bool
}

// run makes n cuts in model warm-ups, or with images in image pulls in a
// machine that also runs containerd, and returns the figures, or why they
// did not run (also on stderr). The error is a run that failed or found a
// violation.
func (p powerCutRun) run(ctx context.Context, e *cli.Env, n int, images bool) (*chaos.PowerCuts, string, error) {
	what, flag := "power cuts", "--vm-cuts"
	cuts, imageCuts := n, 0
	if images {
		what, flag = "power cuts in image pulls", "--vm-image-cuts"
		cuts, imageCuts = 0, n
	}
	skip := func(why string) (*chaos.PowerCuts, string, error) {
		fmt.Fprintf(e.Stderr, "bench chaos: %s skipped: %s\n", what, why)
		return nil, why, nil
	}
	if n == 0 {
		return skip(flag + " 0")
	}
	tools, err := vm.FindTools()
	if err != nil {
		return skip(err.Error())
	}
	// The guest has no C library: the daemon it runs is this binary.
	if static, err := vm.IsStatic(p.bin); err != nil || !static {
		return skip(fmt.Sprintf("%s is not a static binary (%v): build it with CGO_ENABLED=0 (make build)", p.bin, err))
	}
	opts := vm.PowerCutOptions{
		Tools: tools, Daemon: p.bin, AgentArgs: []string{"vm-agent"},
		Cuts: cuts, ImageCuts: imageCuts, Seed: p.seed,
	}
	if images {
		if opts.Containerd, err = testenv.ContainerdPath(); err != nil {
			return skip(err.Error())
		}
		if _, err := testenv.RegistryPath(); err != nil {
			return skip(err.Error())
		}
	}
	dir, err := os.MkdirTemp("", "warmfleet-vm-cuts-")
	if err != nil {
		return nil, "", fmt.Errorf("bench chaos: %w", err)
	}
	defer os.RemoveAll(dir)
	opts.Dir = dir
	s3, stopS3, err := testenv.StartVersitygw(ctx, p.versitygw, dir+"/s3", "")
	if err != nil {
		return nil, "", fmt.Errorf("bench chaos: %s: %w", what, err)
	}
	defer func() { _ = stopS3() }() // the run is over; a versitygw that exits badly changes no figure
	opts.S3 = s3
	if images {
		reg, stopReg, err := testenv.StartRegistryProcess(ctx, dir+"/registry", testenv.RegistryOptions{})
		if err != nil {
			return nil, "", fmt.Errorf("bench chaos: %s: %w", what, err)
		}
		defer func() { _ = stopReg() }() // as versitygw's
		opts.Registry = reg.Addr
	}
	logw := io.Discard
	if p.verbose {
		logw = e.Stderr
	}
	opts.Logf = func(format string, args ...any) { fmt.Fprintf(logw, what+": "+format+"\n", args...) }
	res, err := vm.RunPowerCuts(ctx, opts)
	c := res.CutCounts
	if images {
		c = res.Images
	}
	pc := &chaos.PowerCuts{
		Cuts: c.Cuts, Recovered: c.Recovered(), CorruptReady: c.CorruptReady,
		LostEntries: c.Lost, Seed: p.seed, Seconds: res.Elapsed.Seconds(), SecondsPerCut: c.PerCut().Seconds(),
	}
	if err != nil {
		pc.Error = err.Error()
		return pc, "", fmt.Errorf("bench chaos: %s (--vm-seed %d): %w", what, p.seed, err)
	}
	if len(res.Violations) > 0 {
		pc.Error = strings.Join(res.Violations, "; ")
		return pc, "", fmt.Errorf("bench chaos: %s (--vm-seed %d): %d corrupt ready, %d entries lost: %s", what, p.seed, c.CorruptReady, c.Lost, pc.Error)
	}
	return pc, "", nil
}

// runVMAgent is the guest agent of the power cuts' virtual machines
// (integration/vm/agent): bench chaos --vm-cuts runs this binary in the
// guest as both the daemon and the agent.
func runVMAgent(_ context.Context, e *cli.Env, args []string) error {
	fs := cli.NewFlagSet(e, "vm-agent")
	listen := fs.String("listen", ":7001", "address to serve on")
	if err := cli.ParseFlags(fs, e, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError("unexpected arguments %q", fs.Args())
	}
	return agent.Serve(*listen)
}

func scenarioNames() []string {
	var names []string
	for _, sc := range chaos.Scenarios() {
		names = append(names, sc.Name)
	}
	return names
}
