package lab

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/warmfleet/warmfleet/integration/chaos"
	"github.com/warmfleet/warmfleet/internal/cli"
)

// runBenchChaos runs the chaos suite (integration/chaos): each scenario a
// fault done to a fleet of network-namespace hosts running this binary's
// daemon, with the shared checks after it; it prints one line of figures
// per scenario. It needs root. It exits 1 if a scenario failed.
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
	return nil
}

func scenarioNames() []string {
	var names []string
	for _, sc := range chaos.Scenarios() {
		names = append(names, sc.Name)
	}
	return names
}
