package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
)

func runFleet(ctx context.Context, e *Env, args []string) error {
	return listCommand(ctx, e, "fleet", args, (*api.Client).Fleet, printFleet)
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

func runEndpoint(ctx context.Context, e *Env, args []string) error {
	return subcommand(ctx, e, "endpoint", args, map[string]func(context.Context, *Env, []string) error{
		"add": runEndpointAdd,
		"ls":  runEndpointList,
		"rm":  runEndpointRemove,
	})
}

func runEndpointAdd(ctx context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "endpoint add")
	var c clientFlags
	c.register(fs, false)
	model := fs.String("model", "", "model the endpoint serves")
	url := fs.String("url", "", "base URL of the OpenAI-compatible server, e.g. http://10.0.0.5:8000")
	if err := parseFlags(fs, e, args, nil); err != nil {
		return err
	}
	if *model == "" || *url == "" {
		return usageError("give --model and --url")
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if err := cl.AddEndpoint(ctx, api.Endpoint{Model: *model, URL: *url}); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "endpoint %s for %s registered\n", *url, *model)
	return nil
}

func runEndpointList(ctx context.Context, e *Env, args []string) error {
	return listCommand(ctx, e, "endpoint ls", args, (*api.Client).Endpoints, func(w io.Writer, eps []api.Endpoint) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MODEL\tURL")
		for _, ep := range eps {
			fmt.Fprintf(tw, "%s\t%s\n", ep.Model, ep.URL)
		}
		return tw.Flush()
	})
}

func runEndpointRemove(ctx context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "endpoint rm")
	var c clientFlags
	c.register(fs, false)
	url := fs.String("url", "", "URL of the endpoint to unregister")
	if err := parseFlags(fs, e, args, nil); err != nil {
		return err
	}
	if *url == "" {
		return usageError("give --url")
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if err := cl.RemoveEndpoint(ctx, *url); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "endpoint %s removed\n", *url)
	return nil
}
