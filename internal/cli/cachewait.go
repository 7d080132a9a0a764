package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
)

// cacheWaitCommand is `warmfleet cache wait NAME [--nodes N | --all |
// --local] [--timeout D]`: it reads the cache's status until enough nodes
// hold it ready and never writes anything, so an initContainer or a deploy
// script can run it as often as it likes. Exit 0 when ready, 3 for a cache
// the fleet does not know, 4 on --timeout (saying where each target
// stands), 1 at once when waiting cannot succeed (no node targeted, fewer
// targets than asked, a failure that needs someone to act on this node).
func cacheWaitCommand(e *Env) *cobra.Command {
	var c clientFlags
	var nodes int
	var all, local bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait NAME [--nodes N | --all | --local]",
		Short: "wait until a cache is ready on enough nodes, changing nothing",
		Long: `Wait, without writing anything, until the cache is ready: --local on the
daemon asked (as cache add --wait), --nodes N on N of the nodes its targets
select, --all (the default) on all of them. The fleet-wide count comes from
the gossip inventories. It ends at once (exit 1) when no node is targeted or
--nodes exceeds the spec's --nodes, exits 3 for a cache the fleet does not
know, and on --timeout exits 4 with a line per target node.`,
		Example: `  warmfleet cache wait llama --local --timeout 30m     # in an initContainer
  warmfleet cache wait llama --nodes 4 --timeout 1h
  warmfleet cache wait llama -o json`,
		Args: exactArgs("model NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			modes := 0
			for _, set := range []bool{nodes != 0, all, local} {
				if set {
					modes++
				}
			}
			switch {
			case modes > 1:
				return usageError("--nodes, --all and --local exclude each other")
			case nodes < 0:
				return usageError("--nodes %d: want >= 1", nodes)
			case timeout < 0:
				return usageError("--timeout %s: want >= 0 (0 = wait until ready)", timeout)
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var st api.CacheStatus
			if local {
				st, err = waitReady(ctx, e, cl, name, timeout)
			} else {
				st, err = waitFleet(ctx, e, cl, name, nodes, timeout)
			}
			if err == nil && c.output != "table" {
				return printStatus(e.Stdout, c.output, st)
			}
			return err
		},
	}
	c.register(cmd, true)
	fs := cmd.Flags()
	fs.IntVar(&nodes, "nodes", 0, "wait until this many of the nodes the targets select hold the cache ready")
	fs.BoolVar(&all, "all", false, "wait until every node the targets select holds it ready (the default)")
	fs.BoolVar(&local, "local", false, "wait until this node (the daemon at --api) holds it ready: for an initContainer")
	fs.DurationVar(&timeout, "timeout", 0, "give up after this long with exit code 4 (0 = wait until ready)")
	return cmd
}

// waitFleet polls the daemon until need of the cache's target nodes (all
// of them when need is 0) report it ready, printing each change of the
// count. See fleetVerdict for when it gives up early.
func waitFleet(ctx context.Context, e *Env, cl *api.Client, name string, need int, timeout time.Duration) (api.CacheStatus, error) {
	lastLine := ""
	check := func(st api.CacheStatus) (bool, error) {
		done, err := fleetVerdict(st, need)
		if line := fleetCount(st, need); line != lastLine {
			fmt.Fprintf(e.Stderr, "%s: %s\n", name, line)
			lastLine = line
		}
		return done, err
	}
	ended := func(st api.CacheStatus, signalled bool) error {
		if signalled {
			return fmt.Errorf("stopped waiting for %s: %w (%s)", name, context.Cause(ctx), fleetCount(st, need))
		}
		return fmt.Errorf("%w: %s is not ready on enough nodes after %s: %s; where each target stands:\n%s",
			errTimeout, name, timeout, fleetCount(st, need), fleetStanding(st))
	}
	return pollCache(ctx, cl, name, timeout, check, ended)
}

// fleetVerdict decides from one status whether a fleet-wide wait is over:
// true with nil once need target nodes (0: all of them, at least one)
// report the cache ready; true with the reason when no node is targeted or
// the targets ask for fewer nodes than need, which waiting cannot change
// short of someone editing the spec; false to keep waiting.
func fleetVerdict(st api.CacheStatus, need int) (bool, error) {
	targets := len(st.TargetNodes)
	switch {
	case targets == 0:
		return true, fmt.Errorf("no node is targeted for %s (%s), so no node will cache it: `warmfleet fleet` lists the nodes and their labels; change the targets with `warmfleet cache add %s --source ... --selector k=v`",
			st.Name, targetsText(st.Targets), st.Name)
	case need > 0 && st.Targets.Nodes > 0 && need > st.Targets.Nodes:
		return true, fmt.Errorf("%s is to be held by %d nodes (%s), so --nodes %d can never be met", st.Name, st.Targets.Nodes, targetsText(st.Targets), need)
	case st.ReadyNodes >= wanted(st, need):
		return true, nil
	}
	return false, nil
}

func wanted(st api.CacheStatus, need int) int {
	if need > 0 {
		return need
	}
	return len(st.TargetNodes)
}

// fleetCount reads "2/3 target nodes ready, waiting for 2".
func fleetCount(st api.CacheStatus, need int) string {
	if st.Name == "" {
		return "no status received yet"
	}
	return fmt.Sprintf("%d/%d target nodes ready, waiting for %d", st.ReadyNodes, len(st.TargetNodes), wanted(st, need))
}

// fleetStanding has a line per target node: its state and bytes, or that
// it has not reported the cache yet.
func fleetStanding(st api.CacheStatus) string {
	var b strings.Builder
	for _, node := range st.TargetNodes {
		i := slices.IndexFunc(st.Nodes, func(n api.NodeCacheStatus) bool { return n.Node == node })
		var n api.NodeCacheStatus
		switch {
		case i >= 0:
			n = st.Nodes[i]
		case st.Nodes == nil && len(st.TargetNodes) == 1:
			// A daemon without gossip: its own status is the node's.
			n = api.NodeCacheStatus{State: st.State, BytesDone: st.BytesDone, BytesTotal: st.BytesTotal}
		default:
			fmt.Fprintf(&b, "  %s: no report yet\n", node)
			continue
		}
		fmt.Fprintf(&b, "  %s: %s, %s of %s (%.0f%%)\n", node, n.State,
			bytesize.Format(n.BytesDone), bytesize.Format(n.BytesTotal), percent(n.BytesDone, n.BytesTotal))
	}
	if b.Len() == 0 {
		return "  (no target node)\n"
	}
	return strings.TrimSuffix(b.String(), "\n")
}
