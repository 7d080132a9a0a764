package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/warmfleet/warmfleet/daemon"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/manifest"
)

// applyCommands are `apply` and `diff`, registered in commands().
func applyCommands() []Command {
	return []Command{
		{"apply", "apply declared caches and endpoints from -f FILE|DIR|- (--prune, --owner)", runApply},
		{"diff", "show what apply -f FILE|DIR|- would change", runDiff},
	}
}

func runApply(ctx context.Context, e *Env, args []string) error {
	return applyOrDiff(ctx, e, "apply", args)
}

func runDiff(ctx context.Context, e *Env, args []string) error {
	return applyOrDiff(ctx, e, "diff", args)
}

// applyOrDiff reads the manifests -f names (errors with their lines come
// from here, before the daemon is asked), sends them to the daemon, which
// plans them against what it holds and, for apply, carries the plan out,
// and prints the plan.
func applyOrDiff(ctx context.Context, e *Env, verb string, args []string) error {
	fs := newFlagSet(e, verb)
	var c clientFlags
	c.register(fs, true)
	file := fs.String("f", "", "manifest file, directory of *.yaml/*.yml/*.json files, or - for stdin (required)")
	owner := fs.String("owner", "", "source that owns what this applies; only it may change or prune it (default: file: or dir: and the absolute path; required for -f -)")
	prune := fs.Bool("prune", false, "delete what this owner applied before that the files no longer name (never another owner's)")
	if err := parseFlags(fs, e, args, nil); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	if *file == "" {
		return usageError("-f FILE|DIR|- is required")
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if *owner == "" {
		if *owner, err = manifest.DefaultOwner(*file); err != nil {
			return usageError("%v", err)
		}
	} else if err := manifest.ValidateOwner(*owner); err != nil {
		return usageError("--owner: %v", err)
	}
	objs, err := manifest.Load(*file, e.Stdin)
	if err != nil {
		return err
	}
	req := api.ApplyRequest{Owner: *owner, Prune: *prune, DryRun: verb == "diff"}
	req.Specs, req.Endpoints = manifest.Split(objs)
	res, err := cl.Apply(ctx, req)
	if err != nil {
		return err
	}
	if c.output == "json" {
		enc := json.NewEncoder(e.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	_, err = io.WriteString(e.Stdout, res.Diff)
	return err
}

// applyDirFlags are the daemon's flags for a watched manifest directory.
type applyDirFlags struct {
	dir      string
	interval time.Duration
}

func (f *applyDirFlags) register(fs *flagSet) {
	fs.StringVar(&f.dir, "apply-dir", "", "directory of manifest files (a mounted ConfigMap) applied at start and on every change; each file owns what it declares and a removed file prunes it (empty: off)")
	fs.DurationVar(&f.interval, "apply-interval", 10*time.Second, "how often --apply-dir is read for changes")
}

// start runs the watcher as a part beside the reconciler, when asked for.
func (f *applyDirFlags) start(ps *parts, d *daemon.Daemon) error {
	if f.dir == "" {
		return nil
	}
	if f.interval <= 0 {
		return usageError("--apply-interval %v: want > 0", f.interval)
	}
	ps.start(stageReconciler, "apply dir", func(ctx context.Context) error {
		if err := d.WatchApplyDir(ctx, f.dir, f.interval); err != nil {
			return fmt.Errorf("--apply-dir: %w", err)
		}
		return nil
	}, nil)
	return nil
}
