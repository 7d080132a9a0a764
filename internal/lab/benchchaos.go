package lab

import (
	"context"
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
// running this binary's daemon --vm-cuts times (integration/vm), unless
// the machine lacks qemu, a kernel or busybox, which it says instead of a
// figure. It exits 1 if a scenario failed or a power cut left a corrupt
// ready file or lost an entry.
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
	vmErr := powerCuts(ctx, e, &res, bin, *versitygw, *vmCuts, *vmSeed, *verbose)
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

// powerCuts runs the power cuts into res.PowerCuts, or says in
// res.PowerCutsSkipped (and on stderr) why they did not run. The error is
// a run that failed or found a violation.
func powerCuts(ctx context.Context, e *cli.Env, res *chaos.Result, bin, versitygw string, cuts int, seed uint64, verbose bool) error {
	skip := func(why string) error {
		res.PowerCutsSkipped = why
		fmt.Fprintf(e.Stderr, "bench chaos: power cuts skipped: %s\n", why)
		return nil
	}
	if cuts == 0 {
		return skip("--vm-cuts 0")
	}
	tools, err := vm.FindTools()
	if err != nil {
		return skip(err.Error())
	}
	// The guest has no C library: the daemon it runs is this binary.
	if static, err := vm.IsStatic(bin); err != nil || !static {
		return skip(fmt.Sprintf("%s is not a static binary (%v): build it with CGO_ENABLED=0 (make build)", bin, err))
	}
	dir, err := os.MkdirTemp("", "warmfleet-vm-cuts-")
	if err != nil {
		return fmt.Errorf("bench chaos: %w", err)
	}
	defer os.RemoveAll(dir)
	s3, stopS3, err := testenv.StartVersitygw(ctx, versitygw, dir+"/s3", "")
	if err != nil {
		return fmt.Errorf("bench chaos: power cuts: %w", err)
	}
	defer func() { _ = stopS3() }() // the run is over; a versitygw that exits badly changes no figure
	logw := io.Discard
	if verbose {
		logw = e.Stderr
	}
	pc, err := vm.RunPowerCuts(ctx, vm.PowerCutOptions{
		Tools: tools, Daemon: bin, AgentArgs: []string{"vm-agent"}, S3: s3, Dir: dir,
		Cuts: cuts, Seed: seed,
		Logf: func(format string, args ...any) { fmt.Fprintf(logw, "power cuts: "+format+"\n", args...) },
	})
	res.PowerCuts = &chaos.PowerCuts{
		Cuts: pc.Cuts, Recovered: pc.Recovered(), CorruptReady: pc.CorruptReady,
		LostEntries: pc.Lost, Seed: seed, Seconds: pc.Elapsed.Seconds(),
	}
	if err != nil {
		res.PowerCuts.Error = err.Error()
		return fmt.Errorf("bench chaos: power cuts (--vm-seed %d): %w", seed, err)
	}
	if len(pc.Violations) > 0 {
		res.PowerCuts.Error = strings.Join(pc.Violations, "; ")
		return fmt.Errorf("bench chaos: power cuts (--vm-seed %d): %d corrupt ready, %d entries lost: %s", seed, pc.CorruptReady, pc.Lost, res.PowerCuts.Error)
	}
	return nil
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
