package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/spec"
	"github.com/warmfleet/warmfleet/nvme"
)

func runCache(ctx context.Context, e *Env, args []string) error {
	return subcommand(ctx, e, "cache", args, map[string]func(context.Context, *Env, []string) error{
		"add":    runCacheAdd,
		"ls":     runCacheList,
		"status": runCacheStatus,
		"rm":     runCacheRemove,
		"verify": runCacheVerify,
	})
}

// clientFlags are the flags every client command takes.
type clientFlags struct {
	api       string
	tokenFile string
	output    string
}

func (c *clientFlags) register(fs *flagSet, withOutput bool) {
	fs.StringVar(&c.api, "api", defaultAPI, "daemon API address: unix:///path.sock or host:port")
	fs.StringVar(&c.tokenFile, "api-token-file", "", "file holding the daemon's bearer token")
	if withOutput {
		fs.StringVar(&c.output, "o", "table", "output format: table or json")
	}
}

func (c *clientFlags) client() (*api.Client, error) {
	if c.output != "" && c.output != "table" && c.output != "json" {
		return nil, usageError("-o %q: want table or json", c.output)
	}
	token, err := readToken(c.tokenFile)
	if err != nil {
		return nil, err
	}
	cl, err := api.NewClient(c.api, token)
	if err != nil {
		return nil, usageError("%v", err)
	}
	return cl, nil
}

// oneName parses flags that follow or precede a single model NAME argument.
func oneName(fs *flagSet, e *Env, args []string, what string) (string, error) {
	return oneArg(fs, e, args, what, "model NAME")
}

// oneArg parses flags that follow or precede a single argument, arg, as
// named in the error when it is missing.
func oneArg(fs *flagSet, e *Env, args []string, what, arg string) (string, error) {
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := parseFlags(fs, e, args, nil); err != nil {
		return "", err
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return "", usageError("unexpected arguments %q", fs.Args())
	}
	if name == "" {
		return "", usageError("%s: give the %s", what, arg)
	}
	return name, nil
}

func runCacheAdd(ctx context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "cache add")
	var c clientFlags
	c.register(fs, true)
	source := fs.String("source", "", "S3 folder of the model's files: s3://bucket/prefix/")
	revision := fs.String("revision", "", "revision label (the cache also keys on every object's ETag and version)")
	wait := fs.Bool("wait", false, "wait until the cache is ready on this node")
	timeout := fs.Duration("timeout", 0, "with --wait: give up after this long (0 = never)")
	var selector listFlag
	fs.Var(&selector, "selector", "only nodes with this label k=v (repeatable)")
	nodes := fs.Int("nodes", 0, "only this many of the eligible nodes (0 = all)")
	name, err := oneName(fs, e, args, "cache add")
	if err != nil {
		return err
	}
	if *timeout < 0 {
		return usageError("--timeout %s: want >= 0 (0 = wait until ready)", *timeout)
	}
	sel, err := spec.ParseLabels(selector)
	if err != nil {
		return usageError("--selector: %v", err)
	}
	req := api.AddCacheRequest{Name: name, Source: *source, Revision: *revision, Targets: spec.Targets{Selector: sel, Nodes: *nodes}}
	if err := req.Spec().Validate(); err != nil {
		return usageError("%v", err)
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	st, err := cl.AddCache(ctx, req)
	if err != nil {
		return err
	}
	if !*wait {
		return printStatus(e.Stdout, c.output, st)
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	st, err = waitReady(ctx, e, cl, name)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return printStatus(e.Stdout, c.output, st)
	}
	return nil
}

// waitReady polls the daemon until the cache is ready, showing progress: a
// bar redrawn in place on a terminal, a plain line every few seconds elsewhere.
func waitReady(ctx context.Context, e *Env, cl *api.Client, name string) (api.CacheStatus, error) {
	p := newProgress(e.Stderr)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var lastErr string
	for {
		st, err := cl.Cache(ctx, name)
		if err != nil {
			return st, err
		}
		p.update(st)
		if st.Ready && st.BytesDone >= st.BytesTotal {
			p.done(st)
			return st, nil
		}
		if st.State == api.StateFailed && st.Error != lastErr {
			lastErr = st.Error
			p.note(fmt.Sprintf("attempt %d failed (will retry): %s", st.Attempts, st.Error))
		}
		select {
		case <-ctx.Done():
			p.stop()
			return st, fmt.Errorf("waiting for %s: %w (state %s, last error: %s)", name, ctx.Err(), st.State, orNone(st.Error))
		case <-tick.C:
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

type progress struct {
	w        io.Writer
	tty      bool
	start    time.Time
	lastLine time.Time
	drawn    bool
}

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	return &progress{w: w, tty: ok && term.IsTerminal(int(f.Fd())), start: time.Now()}
}

func (p *progress) update(st api.CacheStatus) {
	elapsed := time.Since(p.start)
	rate := float64(st.BytesDone) / max(elapsed.Seconds(), 0.001)
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%s", progressLine(st, rate, 30))
		p.drawn = true
		return
	}
	if time.Since(p.lastLine) >= 2*time.Second {
		p.lastLine = time.Now()
		fmt.Fprintln(p.w, progressLine(st, rate, 0))
	}
}

func (p *progress) note(msg string) {
	p.stop()
	fmt.Fprintln(p.w, msg)
}

func (p *progress) stop() {
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

func (p *progress) done(st api.CacheStatus) {
	p.stop()
	fmt.Fprintf(p.w, "%s ready: %s (%s) at %s in %s\n", st.Name, st.RevisionID, nvme.FormatBytes(st.BytesTotal),
		st.Path, time.Since(p.start).Round(100*time.Millisecond))
}

// progressLine renders "name [=====     ] 42% 1.2 GiB/2.0 GiB 350 MiB/s downloading";
// width 0 leaves the bar out.
func progressLine(st api.CacheStatus, rate float64, width int) string {
	frac := 0.0
	if st.BytesTotal > 0 {
		frac = min(1, float64(st.BytesDone)/float64(st.BytesTotal))
	}
	bar := ""
	if width > 0 {
		filled := int(frac * float64(width))
		bar = "[" + strings.Repeat("=", filled) + strings.Repeat(" ", width-filled) + "] "
	}
	return fmt.Sprintf("%s %s%3.0f%% %s/%s %s/s %s", st.Name, bar, frac*100,
		nvme.FormatBytes(st.BytesDone), nvme.FormatBytes(st.BytesTotal), nvme.FormatBytes(int64(rate)), st.State)
}

func runCacheList(ctx context.Context, e *Env, args []string) error {
	return listCommand(ctx, e, "cache ls", args, (*api.Client).Caches, printTable)
}

// listCommand is a client command that takes no arguments, gets one value
// from the daemon and prints it as a table or, with -o json, as JSON.
func listCommand[T any](ctx context.Context, e *Env, name string, args []string,
	get func(*api.Client, context.Context) (T, error), table func(io.Writer, T) error) error {
	fs := newFlagSet(e, name)
	var c clientFlags
	c.register(fs, true)
	if err := parseFlags(fs, e, args, nil); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	v, err := get(cl, ctx)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return writeJSONOut(e.Stdout, v)
	}
	return table(e.Stdout, v)
}

func runCacheStatus(ctx context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "cache status")
	var c clientFlags
	c.register(fs, true)
	name, err := oneName(fs, e, args, "cache status")
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	st, err := cl.Cache(ctx, name)
	if err != nil {
		return err
	}
	return printStatus(e.Stdout, c.output, st)
}

func runCacheRemove(ctx context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "cache rm")
	var c clientFlags
	c.register(fs, false)
	name, err := oneName(fs, e, args, "cache rm")
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if err := cl.RemoveCache(ctx, name); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "%s removed\n", name)
	return nil
}

func printStatus(w io.Writer, format string, st api.CacheStatus) error {
	if format == "json" {
		return writeJSONOut(w, st)
	}
	return printTable(w, []api.CacheStatus{st})
}

func printTable(w io.Writer, all []api.CacheStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tREADY\tPROGRESS\tSIZE\tREVISION\tPATH\tERROR")
	for _, st := range all {
		pct := 0.0
		if st.BytesTotal > 0 {
			pct = 100 * float64(st.BytesDone) / float64(st.BytesTotal)
		}
		fmt.Fprintf(tw, "%s\t%s\t%t\t%.0f%%\t%s\t%s\t%s\t%s\n", st.Name, st.State, st.Ready, pct,
			nvme.FormatBytes(st.BytesTotal), st.RevisionID, st.Path, st.Error)
	}
	return tw.Flush()
}

func writeJSONOut(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
