// Package cli implements the warmfleet command line on spf13/cobra: one
// command per job (groups such as `cache` and `image` hold their verbs),
// each a small function that reads its flags, builds the parts it needs and
// runs them. Flags may also come from WARMFLEET_* environment variables and,
// for the daemon, from a YAML file (flags > env > file > default).
//
// Every command's help (`warmfleet CMD --help`) shows its positional
// arguments, its flags and examples; listings take -o table|json|yaml;
// `completion bash|zsh|fish` writes a shell completion script. The exit
// codes are in exitCodesHelp.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/daemon/api"
)

// Env is what a command may touch of the outside world.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	// Clock is the wall clock the daemon stamps desired-state writes and
	// inventory versions with; nil is time.Now. No flag reaches it and the
	// product (StdEnv) leaves it nil: the lab sets it to run a daemon whose
	// clock is skewed (internal/lab, WARMFLEET_LAB_CLOCK_SKEW).
	Clock func() time.Time
}

// StdEnv returns the process's own standard streams and environment.
func StdEnv() *Env {
	return &Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
}

// Command is a command that parses its own arguments (the lab's commands,
// on Go's flag package): its name, a line of help and what it runs. Its
// --help is its own.
type Command struct {
	Name    string
	Summary string
	Run     func(ctx context.Context, e *Env, args []string) error
}

// productCommands builds the product's command tree for e; the lab binary
// (internal/lab) adds its own commands next to these.
func productCommands(e *Env) []*cobra.Command {
	return []*cobra.Command{
		daemonCommand(e),
		cacheCommand(e),
		torrentCommand(e),
		fleetCommand(e),
		imageCommand(e),
		endpointCommand(e),
		routerCommand(e),
		keygenCommand(e),
		gossipCommand(e),
		versionCommand(e),
		applyCommand(e, false),
		applyCommand(e, true),
		deleteCommand(e),
	}
}

// errUsage marks an error that is the caller's: exit code 2.
var errUsage = errors.New("usage")

// usageError wraps a message as a usage error.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// Run runs the product command line args (without the program name) and
// returns the process exit code.
func Run(ctx context.Context, args []string, e *Env) int {
	return Dispatch(ctx, "warmfleet", nil, args, e)
}

// Dispatch runs the command line args of program prog, made of the
// product's commands and cmds (a command of cmds named like a product
// command is the product's), and returns the process exit code.
func Dispatch(ctx context.Context, prog string, cmds []Command, args []string, e *Env) int {
	cmd, err := execute(ctx, newRoot(prog, cmds, e), args)
	if err == nil || errors.Is(err, errHelpShown) {
		return 0
	}
	fmt.Fprintf(e.Stderr, "%s: %v\n", cmd.CommandPath(), err)
	if errors.Is(err, errUsage) {
		fmt.Fprintf(e.Stderr, "run '%s --help' for usage\n", cmd.CommandPath())
	}
	return exitCode(err)
}

// execute runs root on args and returns the command that ran and its error.
func execute(ctx context.Context, root *cobra.Command, args []string) (*cobra.Command, error) {
	// Never nil: cobra reads os.Args when the arguments are nil.
	root.SetArgs(append([]string{}, args...))
	cmd, err := root.ExecuteContextC(ctx)
	if cmd == nil {
		cmd = root
	}
	return cmd, err
}

// Exit codes, as exitCodesHelp and the README's CLI part document them.
const (
	exitFailure  = 1
	exitUsage    = 2
	exitNotFound = 3
	exitTimeout  = 4
)

// exitCodesHelp documents the exit codes in the root command's help.
const exitCodesHelp = `Exit codes:
  0  success
  1  failure (the error says what to do next)
  2  usage: a bad flag, argument or setting
  3  not found: no such cache, image owner or endpoint
  4  timed out: the --timeout of cache add --wait or cache wait passed before the cache was ready`

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

// newRoot builds the command tree of program prog: the product's commands,
// then those of cmds it does not have, help and completion.
func newRoot(prog string, cmds []Command, e *Env) *cobra.Command {
	root := &cobra.Command{
		Use:   prog,
		Short: prog + " keeps a GPU inference fleet warm",
		Long: prog + ` keeps a GPU inference fleet warm: a daemon on every node caches model
weights from S3 or the Hugging Face Hub (shared between nodes peer to peer)
and pre-pulls container images; the router sends each request to a backend that already holds its
prompt's prefix.

Client commands talk to the local daemon (--api, default ` + defaultAPI + `).

` + exitCodesHelp,
		Example: `  ` + prog + ` daemon --data-dir /var/lib/warmfleet
  ` + prog + ` cache add llama --source s3://models/llama-3-8b/ --wait
  ` + prog + ` cache --help`,
		Version: versionText(),
		Args:    unknownCommand,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprint(e.Stderr, cmd.UsageString())
			return usageError("give a command")
		},
		SilenceErrors: true,
		SilenceUsage:  true,
		// Every product command reads WARMFLEET_* for the flags not given.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return layerFlags(cmd.Flags(), e, nil)
		},
	}
	// Before the completion command is made: it keeps the writer it finds.
	root.SetOut(e.Stdout)
	root.SetErr(e.Stderr)
	if e.Stdin != nil {
		root.SetIn(e.Stdin)
	}
	root.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return fmt.Errorf("%w: %v", errUsage, err)
	})
	root.AddCommand(productCommands(e)...)
	for _, c := range cmds {
		if sub, _, err := root.Find([]string{c.Name}); err == nil && sub != root {
			continue
		}
		root.AddCommand(rawCommand(c, e))
	}
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Short = "show the help of a command"
			c.Example = "  " + prog + " help cache add"
		case "completion":
			c.Short = "write a shell completion script: bash, zsh, fish or powershell"
			c.Example = "  source <(" + prog + " completion bash)\n  " + prog + " completion zsh > \"${fpath[1]}/_" + prog + "\""
			for _, sh := range c.Commands() {
				sh.Example = "  " + prog + " completion " + sh.Name() + " --help"
			}
		}
	}
	return root
}

// unknownCommand is the root's argument check: any argument left is a
// command it does not have.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return usageError("unknown command %q (%s --help lists them)", args[0], cmd.Root().Name())
}

// rawCommand wraps a command that parses its own arguments.
func rawCommand(c Command, e *Env) *cobra.Command {
	return &cobra.Command{
		Use:                c.Name + " [flags]",
		Short:              c.Summary,
		Example:            "  " + c.Name + " --help",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.Run(cmd.Context(), e, args)
		},
	}
}

// group is a command that holds verbs: on its own, or with a verb it does
// not have, it is a usage error that lists them.
func group(use, short, example string, verbs ...*cobra.Command) *cobra.Command {
	g := &cobra.Command{
		Use:                   use,
		Short:                 short,
		Example:               example,
		Args:                  cobra.ArbitraryArgs,
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			var names []string
			for _, c := range cmd.Commands() {
				if c.IsAvailableCommand() {
					names = append(names, c.Name())
				}
			}
			if len(args) == 0 {
				return usageError("%s needs a subcommand: %s", cmd.Name(), strings.Join(names, ", "))
			}
			return usageError("unknown %s subcommand %q (want one of %s)", cmd.Name(), args[0], strings.Join(names, ", "))
		},
	}
	g.AddCommand(verbs...)
	return g
}

// exactArgs wants exactly the positional arguments named in names, as the
// command's Use shows them (for example "model NAME").
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < len(names):
			return usageError("%s: give the %s", cmd.Name(), names[len(args)])
		case len(args) > len(names):
			return usageError("unexpected arguments %q", args[len(names):])
		}
		return nil
	}
}

// noArgs wants no positional argument.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError("unexpected arguments %q", args)
	}
	return nil
}

func versionCommand(e *Env) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "print the version and the commit it was built from",
		Example: "  warmfleet version\n  warmfleet --version",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(e.Stdout, cmd.Root().Name(), versionText())
			return err
		},
	}
}
