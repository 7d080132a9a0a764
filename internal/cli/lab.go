package cli

import (
	"context"
	"flag"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/s3origin"
)

// What the lab binary (cmd/warmfleet-lab, internal/lab) shares with the
// product's command line: the dispatcher, the flag helpers and the
// long-running commands it runs in-process. The lab imports this package;
// this package never imports the lab, so the product binary links none of
// the lab's test support.

// Commands returns the product's subcommands.
func Commands() []Command { return commands() }

// ByteSize is a flag holding a size such as 512MiB, 10GB or 1048576.
type ByteSize = byteSize

// ListFlag is a repeatable flag that also takes comma-separated values.
type ListFlag = listFlag

// NewFlagSet returns a flag set for command name that reports errors
// instead of exiting.
func NewFlagSet(e *Env, name string) *flag.FlagSet { return newFlagSet(e, name) }

// ParseFlags parses args, then fills every flag not given from
// WARMFLEET_<FLAG_NAME>; a bad flag is a usage error (exit 2).
func ParseFlags(fs *flag.FlagSet, e *Env, args []string) error {
	return parseFlags(fs, e, args, nil)
}

// UsageError is an error that is the caller's: exit code 2.
func UsageError(format string, args ...any) error { return usageError(format, args...) }

// Subcommand dispatches args to one of a group's subcommands.
func Subcommand(ctx context.Context, e *Env, group string, args []string, subs map[string]func(context.Context, *Env, []string) error) error {
	return subcommand(ctx, e, group, args, subs)
}

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

func runDaemon(ctx context.Context, e *Env, args []string) error {
	return ServeDaemon(ctx, e, args, s3origin.Options{}, nil)
}

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
