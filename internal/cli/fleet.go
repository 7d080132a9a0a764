package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
)

func fleetCommand(e *Env) *cobra.Command {
	return listCommand(e, "fleet", "show fleet members and what each holds",
		"  warmfleet fleet\n  warmfleet fleet -o json", (*api.Client).Fleet, printFleet)
}

func printFleet(w io.Writer, f api.Fleet) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tROLE\tADDR\tFREE\tREADY\tIN PROGRESS\tENDPOINTS")
	for _, m := range f.Members {
		var ready, busy []string
		for _, name := range slices.Sorted(maps.Keys(m.Models)) {
			mm := m.Models[name]
			switch mm.State {
			case api.StateReady:
				ready = append(ready, name)
			case api.StateFailed:
				busy = append(busy, name+" (failed)")
			default:
				busy = append(busy, fmt.Sprintf("%s %.0f%%", name, percent(mm.BytesDone, mm.BytesTotal)))
			}
		}
		name := m.Name
		if m.Self {
			name += " *"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", name, m.State, m.Role, orDash(m.Addr),
			bytesize.Format(m.FreeBytes), orDash(strings.Join(ready, ",")), orDash(strings.Join(busy, ",")), len(m.Endpoints))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func endpointCommand(e *Env) *cobra.Command {
	return group("endpoint", "register inference endpoints on this node: add, ls, rm",
		"  warmfleet endpoint add --model llama --url http://10.0.0.5:8000\n  warmfleet endpoint ls",
		endpointAddCommand(e), endpointListCommand(e), endpointRemoveCommand(e))
}

// endpointCommandOf is `endpoint add` or `endpoint rm`: both name the
// endpoint by --url, add also by --model.
func endpointCommandOf(e *Env, use, short, example, urlHelp string, adding bool, run func(ctx context.Context, cl *api.Client, ep api.Endpoint) error) *cobra.Command {
	var c clientFlags
	var ep api.Endpoint
	cmd := &cobra.Command{
		Use: use, Short: short, Example: example, Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case adding && (ep.Model == "" || ep.URL == ""):
				return usageError("give --model and --url")
			case ep.URL == "":
				return usageError("give --url")
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			return run(cmd.Context(), cl, ep)
		},
	}
	c.register(cmd, false)
	if adding {
		cmd.Flags().StringVar(&ep.Model, "model", "", "model the endpoint serves")
		cmd.Flags().Float64Var(&ep.Speed, "speed", 0, "its engine's prefill and decode speed relative to the fleet's usual backend, e.g. 2 for a GPU twice as fast: routers give it that many times the traffic share (0: 1)")
	}
	cmd.Flags().StringVar(&ep.URL, "url", "", urlHelp)
	return cmd
}

func endpointAddCommand(e *Env) *cobra.Command {
	return endpointCommandOf(e, "add --model MODEL --url URL", "register an OpenAI-compatible server that serves a model on this node",
		"  warmfleet endpoint add --model llama --url http://10.0.0.5:8000\n  warmfleet endpoint add --model llama --url http://10.0.0.6:8000 --speed 2",
		"base URL of the OpenAI-compatible server, e.g. http://10.0.0.5:8000", true,
		func(ctx context.Context, cl *api.Client, ep api.Endpoint) error {
			if err := cl.AddEndpoint(ctx, ep); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "endpoint %s for %s registered\n", ep.URL, ep.Model)
			return nil
		})
}

func endpointListCommand(e *Env) *cobra.Command {
	return listCommand(e, "ls", "list the endpoints registered on this node",
		"  warmfleet endpoint ls\n  warmfleet endpoint ls -o json", (*api.Client).Endpoints, func(w io.Writer, eps []api.Endpoint) error {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MODEL\tURL\tSPEED")
			for _, ep := range eps {
				speed := "-"
				if ep.Speed != 0 {
					speed = strconv.FormatFloat(ep.Speed, 'g', -1, 64)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", ep.Model, ep.URL, speed)
			}
			return tw.Flush()
		})
}

func endpointRemoveCommand(e *Env) *cobra.Command {
	return endpointCommandOf(e, "rm --url URL", "unregister an endpoint",
		"  warmfleet endpoint rm --url http://10.0.0.5:8000", "URL of the endpoint to unregister", false,
		func(ctx context.Context, cl *api.Client, ep api.Endpoint) error {
			if err := cl.RemoveEndpoint(ctx, ep.URL); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "endpoint %s removed\n", ep.URL)
			return nil
		})
}
