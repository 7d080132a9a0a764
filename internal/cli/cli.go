// Package cli implements the warmfleet command line: one subcommand per job,
// each a small function that parses its flags, builds the parts it needs and
// runs them. Flags may also come from WARMFLEET_* environment variables and,
// for long-running commands, from a YAML file (flags > env > file > default).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/warmfleet/warmfleet/daemon/api"
)

// Env is what a command may touch of the outside world.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
}

// StdEnv returns the process's own standard streams and environment.
func StdEnv() *Env {
	return &Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
}

// Command is one subcommand: its name, a line of help and what it runs.
type Command struct {
	Name    string
	Summary string
	Run     func(ctx context.Context, e *Env, args []string) error
}

// commands are the product's subcommands; the lab binary (internal/lab)
// adds its own to these.
func commands() []Command {
	return append([]Command{
		{"daemon", "run the node daemon (cache, gossip, swarm, image cache, API)", runDaemon},
		{"cache", "manage model weight caches: add, ls, status, wait, verify, rm", runCache},
		{"fleet", "show fleet members and what each holds", runFleet},
		{"image", "manage container image caches: add, ls, rm", runImage},
		{"endpoint", "register inference endpoints on this node: add, ls, rm", runEndpoint},
		{"router", "run the prefix-aware OpenAI-compatible router", runRouter},
		{"keygen", "write a new cluster key", runKeygen},
		{"gossip", "fleet gossip administration: keys list, install, use, remove", runGossip},
		{"version", "print the version", runVersion},
	}, applyCommands()...)
}

// errUsage marks an error that is the caller's: exit code 2.
var errUsage = errors.New("usage")

// usageError wraps a message as a usage error.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// Run runs the product command named by args[0] and returns the process
// exit code.
func Run(ctx context.Context, args []string, e *Env) int {
	return Dispatch(ctx, "warmfleet", commands(), args, e)
}

// Dispatch runs the command of cmds named by args[0] for program prog and
// returns the process exit code.
func Dispatch(ctx context.Context, prog string, cmds []Command, args []string, e *Env) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(e.Stderr, prog, cmds)
		if len(args) == 0 {
			return exitUsage
		}
		return 0
	}
	for _, c := range cmds {
		if c.Name != args[0] {
			continue
		}
		err := c.Run(ctx, e, args[1:])
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		}
		fmt.Fprintf(e.Stderr, "%s %s: %v\n", prog, c.Name, err)
		return exitCode(err)
	}
	fmt.Fprintf(e.Stderr, "%s: unknown command %q\n\n", prog, args[0])
	printUsage(e.Stderr, prog, cmds)
	return exitUsage
}

// Exit codes, as the README's CLI part documents them.
const (
	exitFailure  = 1
	exitUsage    = 2
	exitNotFound = 3
	exitTimeout  = 4
)

// exitCode maps a command's error to the process exit code.
func exitCode(err error) int {
	switch {
	case errors.Is(err, errUsage):
		return exitUsage
	case api.IsNotFound(err):
		return exitNotFound
	case errors.Is(err, errTimeout):
		return exitTimeout
	}
	return exitFailure
}

func printUsage(w io.Writer, prog string, cmds []Command) {
	fmt.Fprintf(w, "usage: %s COMMAND [flags]\n\ncommands:\n", prog)
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-9s %s\n", c.Name, c.Summary)
	}
}

// subcommand dispatches args to one of a group's subcommands (cache add, ...).
func subcommand(ctx context.Context, e *Env, group string, args []string, subs map[string]func(context.Context, *Env, []string) error) error {
	names := make([]string, 0, len(subs))
	for n := range subs {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(args) == 0 {
		return usageError("%s needs a subcommand: %s", group, strings.Join(names, ", "))
	}
	run, ok := subs[args[0]]
	if !ok {
		return usageError("unknown %s subcommand %q (want one of %s)", group, args[0], strings.Join(names, ", "))
	}
	return run(ctx, e, args[1:])
}

// newFlagSet returns a flag set that reports errors instead of exiting.
type flagSet = flag.FlagSet

func newFlagSet(e *Env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("warmfleet "+name, flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	return fs
}

// parseFlags parses args, then fills every flag not given on the command line
// from WARMFLEET_<FLAG_NAME> (dashes become underscores) and then from file
// (keys are flag names). Values are validated by the flags themselves.
func parseFlags(fs *flag.FlagSet, e *Env, args []string, file map[string]string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	for k := range file {
		if fs.Lookup(k) == nil || k == "config" {
			errs = append(errs, fmt.Errorf("config key %q is not a flag of this command", k))
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		key := "WARMFLEET_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := e.Getenv(key); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", key, v, err))
			}
			return
		}
		if v, ok := file[f.Name]; ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("config key %q=%q: %w", f.Name, v, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

func runVersion(_ context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "version")
	if err := parseFlags(fs, e, args, nil); err != nil {
		return err
	}
	fmt.Fprintln(e.Stdout, "warmfleet", Version())
	return nil
}
