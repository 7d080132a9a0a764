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
			return sendManifests(cmd.Context(), e, &c, file, owner, api.ApplyRequest{Prune: prune, DryRun: dryRun})
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

// sendManifests reads the manifests file names (errors with their lines
// come from here, before the daemon is asked), fills req's owner (owner,
// else the file's) and objects, sends it and prints the daemon's plan.
func sendManifests(ctx context.Context, e *Env, c *clientFlags, file, owner string, req api.ApplyRequest) error {
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
	req.Owner = owner
	req.Specs, req.Endpoints = manifest.Split(objs)
	res, err := cl.Apply(ctx, req)
	if err != nil {
		return err
	}
	return printOut(e.Stdout, c.output, res, func(w io.Writer, res api.ApplyResult) error {
		if res.DryRun && req.Delete {
			if _, err := io.WriteString(w, "(dry run: nothing changed)\n"); err != nil {
				return err
			}
		}
		_, err := io.WriteString(w, res.Diff)
		return err
	})
}

// deleteCommand is `delete -f`: it deletes what the manifests name, as
// the owner that applied them (or what was made by hand), never another
// owner's; --dry-run shows what it would delete.
func deleteCommand(e *Env) *cobra.Command {
	var c clientFlags
	var file, owner string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "delete -f FILE|DIR|-",
		Short: "delete the caches and endpoints declared in -f FILE|DIR|- (--dry-run shows what would go)",
		Long: `Delete the ModelCache, ImageCache and Endpoint objects that manifest files
declare, by kind and name (an Endpoint by URL; the spec fields are not
compared): a FILE, a DIR of *.yaml/*.yml/*.json files, or - for stdin
(with --owner). Decoding is as strict as apply's. Objects the owner
(--owner, default the file's, as for apply) applied, and objects made by
hand, are deleted; one another owner applied refuses the whole delete
(exit 1, every key and owner named); names the daemon does not hold are
counted as "not held" and skipped. Caches leave the fleet's desired state
(every node frees the space); endpoints leave the node asked.`,
		Example: `  warmfleet delete -f caches.yaml --dry-run
  warmfleet delete -f caches.yaml
  kubectl get cm caches -o jsonpath='{.data.caches\.yaml}' | warmfleet delete -f - --owner cm:caches`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return sendManifests(cmd.Context(), e, &c, file, owner, api.ApplyRequest{Delete: true, DryRun: dryRun})
		},
	}
	c.register(cmd, true)
	fs := cmd.Flags()
	fs.StringVarP(&file, "f", "f", "", "manifest file, directory of *.yaml/*.yml/*.json files, or - for stdin (required)")
	fs.StringVar(&owner, "owner", "", "owner that applied what is deleted (default: file: or dir: and the absolute path; required for -f -)")
	fs.BoolVar(&dryRun, "dry-run", false, "show what would be deleted; delete nothing")
	return cmd
}

// applyDirFlags are the daemon's flags for a watched manifest directory.
type applyDirFlags struct {
	dir      string
	pool     string
	interval time.Duration
}

func (f *applyDirFlags) register(fs *flagSet) {
	fs.StringVar(&f.dir, "apply-dir", "", "directory of manifest files (a mounted ConfigMap) applied at start and on every change; each file owns what it declares and a removed file prunes it (empty: off)")
	fs.DurationVar(&f.interval, "apply-interval", 10*time.Second, "how often --apply-dir is read for changes")
	fs.StringVar(&f.pool, "apply-pool", "", "node pool whose daemons mount this --apply-dir (a-z, 0-9, -, _, .): its files' owners name the pool, so pools that mount their own ConfigMaps at one path each prune only their own (empty: one directory for the whole fleet)")
}

// check refuses a bad --apply-pool before the daemon opens anything.
func (f *applyDirFlags) check() error {
	if f.pool == "" {
		return nil
	}
	if f.dir == "" {
		return usageError("--apply-pool needs --apply-dir")
	}
	if err := daemon.ValidatePool(f.pool); err != nil {
		return usageError("--apply-pool: %v", err)
	}
	return nil
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
		if err := d.WatchApplyDir(ctx, f.dir, f.pool, f.interval); err != nil {
			return fmt.Errorf("--apply-dir: %w", err)
		}
		return nil
	}, nil)
	return nil
}
