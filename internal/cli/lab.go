package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/warmfleet/warmfleet/daemon/api"
)

// What the lab binary (cmd/warmfleet-lab, internal/lab) shares with the
// product's command line: the dispatcher, the flag helpers and the
// long-running commands it runs in-process. The lab imports this package;
// this package never imports the lab, so the product binary links none of
// the lab's test support.

// Commands returns the product's commands, each as a Command that runs it
// with its arguments. Dispatch runs the product's own tree for these names.
func Commands() []Command {
	var out []Command
	for _, c := range productCommands(&Env{}) {
		name := c.Name()
		out = append(out, Command{Name: name, Summary: c.Short, Run: func(ctx context.Context, e *Env, args []string) error {
			_, err := execute(ctx, newRoot("warmfleet", nil, e), append([]string{name}, args...))
			return err
		}})
	}
	return out
}

// ByteSize is a flag holding a size such as 512MiB, 10GB or 1048576.
type ByteSize = byteSize

// ListFlag is a repeatable flag that also takes comma-separated values.
type ListFlag = listFlag

// NewFlagSet returns a flag set (Go's flag package) for the lab command name that
// reports errors instead of exiting.
func NewFlagSet(e *Env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("warmfleet-lab "+name, flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	return fs
}

// ParseFlags parses args, then fills every flag not given from
// WARMFLEET_<FLAG_NAME>; a bad flag is a usage error (exit 2), --help
// prints the flags and is no error.
func ParseFlags(fs *flag.FlagSet, e *Env, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelpShown
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return layerStdFlags(fs, e)
}

// UsageError is an error that is the caller's: exit code 2.
func UsageError(format string, args ...any) error { return usageError(format, args...) }

// Subcommand dispatches args to one of a group's subcommands.
func Subcommand(ctx context.Context, e *Env, group string, args []string, subs map[string]func(context.Context, *Env, []string) error) error {
	names := slices.Sorted(maps.Keys(subs))
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintf(e.Stdout, "usage: %s COMMAND [flags]\n\ncommands: %s\n", group, strings.Join(names, ", "))
		return nil
	}
	if len(args) == 0 {
		return usageError("%s needs a subcommand: %s", group, strings.Join(names, ", "))
	}
	run, ok := subs[args[0]]
	if !ok {
		return usageError("unknown %s subcommand %q (want one of %s)", group, args[0], strings.Join(names, ", "))
	}
	return run(ctx, e, args[1:])
}

// errHelpShown is a lab command's --help: its flag set printed the help,
// and the command exits 0.
var errHelpShown = errors.New("help shown")

// WaitReady waits for a cache as `cache add --wait` does (timeout 0: no
// limit), showing progress on e.Stderr.
func WaitReady(ctx context.Context, e *Env, cl *api.Client, name string) (api.CacheStatus, error) {
	return waitReady(ctx, e, cl, name, 0)
}

// ServeRouter runs `warmfleet router args...` until ctx ends; onListen, if
// not nil, gets the API listener's address.
func ServeRouter(ctx context.Context, e *Env, args []string, onListen func(net.Addr)) error {
	return serveRouter(ctx, e, args, onListen)
}

// TuneRouterGC sets the router's GC target, for a process that runs the
// router in-process (bench router).
func TuneRouterGC() { tuneRouterGC() }

// Main runs a binary's command line: run gets the arguments after the
// program name and a context that ends on SIGINT or SIGTERM, and its result
// is the exit code.
func Main(run func(ctx context.Context, args []string, e *Env) int) {
	os.Exit(runUntilSignal(run, os.Args[1:]))
}

// runUntilSignal runs run on args with a context that ends on SIGINT or
// SIGTERM and returns its exit code.
func runUntilSignal(run func(ctx context.Context, args []string, e *Env) int, args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, args, StdEnv())
}
