package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/daemon"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/manifest"
)

// applyCommand is `apply` or, with dryRun, `diff`: it reads the manifests
// -f names (errors with their lines come from here, before the daemon is
// asked), sends them to the daemon, which plans them against what it holds
// and, for apply, carries the plan out, and prints the plan.
func applyCommand(e *Env, dryRun bool) *cobra.Command {
	var c clientFlags
	var file, owner string
	var prune bool
	cmd := &cobra.Command{
		Use:   "apply -f FILE|DIR|-",
		Short: "apply declared caches and endpoints from -f FILE|DIR|- (--prune, --owner)",
		Long: `Apply the ModelCache, ImageCache and Endpoint objects of manifest files: a
FILE, a DIR of *.yaml/*.yml/*.json files, or - for stdin (with --owner).
Decoding is strict and an error applies nothing. What apply creates records
its owner: apply creates and updates, adopts caches made by hand, and
refuses to touch what another owner applied; --prune deletes what the same
owner applied that the input no longer names. Caches go to the fleet's
desired state, endpoints to the node asked.`,
		Example: `  warmfleet apply -f caches.yaml
  warmfleet apply -f /etc/warmfleet/caches --prune
  kubectl get cm caches -o jsonpath='{.data.caches\.yaml}' | warmfleet apply -f - --owner cm:caches`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usageError("-f FILE|DIR|- is required")
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			if owner == "" {
				if owner, err = manifest.DefaultOwner(file); err != nil {
					return usageError("%v", err)
				}
			} else if err := manifest.ValidateOwner(owner); err != nil {
				return usageError("--owner: %v", err)
			}
			objs, err := manifest.Load(file, e.Stdin)
			if err != nil {
				return err
			}
			req := api.ApplyRequest{Owner: owner, Prune: prune, DryRun: dryRun}
			req.Specs, req.Endpoints = manifest.Split(objs)
			res, err := cl.Apply(cmd.Context(), req)
			if err != nil {
				return err
			}
			return printOut(e.Stdout, c.output, res, func(w io.Writer, res api.ApplyResult) error {
				_, err := io.WriteString(w, res.Diff)
				return err
			})
		},
	}
	if dryRun {
		cmd.Use = "diff -f FILE|DIR|-"
		cmd.Short = "show what apply -f FILE|DIR|- would change; changes nothing"
		cmd.Long = "Show what `warmfleet apply` would change, with the same flags; nothing is changed."
		cmd.Example = "  warmfleet diff -f caches.yaml\n  warmfleet diff -f /etc/warmfleet/caches --prune -o json"
	}
	c.register(cmd, true)
	fs := cmd.Flags()
	// Named f, as before the move to cobra: -f and --f are given on the
	// command line, WARMFLEET_F in the environment.
	fs.StringVarP(&file, "f", "f", "", "manifest file, directory of *.yaml/*.yml/*.json files, or - for stdin (required)")
	fs.StringVar(&owner, "owner", "", "source that owns what this applies; only it may change or prune it (default: file: or dir: and the absolute path; required for -f -)")
	fs.BoolVar(&prune, "prune", false, "delete what this owner applied before that the files no longer name (never another owner's)")
	return cmd
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
