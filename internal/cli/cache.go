package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/spec"
)

func cacheCommand(e *Env) *cobra.Command {
	return group("cache", "manage model weight caches: add, ls, status, wait, verify, rm",
		"  warmfleet cache add llama --source s3://models/llama-3-8b/ --wait\n  warmfleet cache wait llama --nodes 4\n  warmfleet cache ls -o yaml",
		cacheAddCommand(e), cacheListCommand(e), cacheStatusCommand(e), cacheWaitCommand(e), cacheVerifyCommand(e), cacheRemoveCommand(e))
}

// clientFlags are the flags every client command takes.
type clientFlags struct {
	api       string
	tokenFile string
	output    string
}

// register adds the client flags to cmd, and -o when withOutput, and
// makes cmd's failure to reach the daemon say what to do (cmd.RunE is set).
func (c *clientFlags) register(cmd *cobra.Command, withOutput bool) {
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error { return unreachableHint(run(cmd, args)) }
	fs := cmd.Flags()
	fs.StringVar(&c.api, "api", defaultAPI, "daemon API address: unix:///path.sock or host:port")
	fs.StringVar(&c.tokenFile, "api-token-file", "", "file holding the daemon's bearer token")
	if withOutput {
		addOutputFlag(cmd, &c.output)
	}
}

// unreachableHint adds what to do to a client command's failure to connect
// to the daemon.
func unreachableHint(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Errorf("%w: is the daemon running? Start it with 'warmfleet daemon', or point --api (or WARMFLEET_API) at it", err)
	}
	return err
}

func (c *clientFlags) client() (*api.Client, error) {
	if c.output != "" {
		if err := checkOutput(c.output); err != nil {
			return nil, err
		}
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

func cacheAddCommand(e *Env) *cobra.Command {
	var c clientFlags
	var source, revision string
	var wait bool
	var timeout time.Duration
	var selector, include, exclude listFlag
	var nodes, priority int
	var pin bool
	cmd := &cobra.Command{
		Use:   "add NAME --source s3://BUCKET/PREFIX/|hf://ORG/MODEL",
		Short: "cache a model's weights from S3 or the Hugging Face Hub on the nodes its targets select",
		Long: `Add (or update) a model cache: every node the targets select downloads the
files under --source to its NVMe, from the origin (S3, the Hugging Face Hub)
or from peers that have them; --include and --exclude keep a part of them.
With --wait, the command follows this node's download and returns when the
cache is ready, when it cannot become ready here without help (the node is
not targeted, the source is empty or refused), or after --timeout (exit 4).
--pin and --priority are the capacity rules: a pinned cache is never
evicted, and a cache may evict only caches of its priority or lower. An add
sets every field, so an add without --pin unpins.`,
		Example: `  warmfleet cache add llama --source s3://models/llama-3-8b/ --wait
  warmfleet cache add llama --source s3://models/llama-3-8b/ --selector gpu=h100 --nodes 4
  warmfleet cache add llama --source s3://models/llama-3-8b/ --pin --priority 100
  warmfleet cache add llama --source s3://models/llama-3-8b/ --wait --timeout 30m -o json
  warmfleet cache add qwen --source hf://Qwen/Qwen2.5-0.5B@main --include '*.safetensors' --include '*.json'`,
		Args: exactArgs("model NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if timeout < 0 {
				return usageError("--timeout %s: want >= 0 (0 = wait until ready)", timeout)
			}
			sel, err := spec.ParseLabels(selector)
			if err != nil {
				return usageError("--selector: %v", err)
			}
			req := api.AddCacheRequest{Name: name, Source: source, Revision: revision, Include: include, Exclude: exclude,
				Targets: spec.Targets{Selector: sel, Nodes: nodes}, Pin: pin, Priority: priority}
			if err := req.Spec().Validate(); err != nil {
				return usageError("%v", err)
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			st, err := cl.AddCache(ctx, req)
			if err != nil {
				return err
			}
			if !wait {
				return printStatus(e.Stdout, c.output, st)
			}
			st, err = waitReady(ctx, e, cl, name, timeout)
			if err != nil {
				return err
			}
			if c.output != "table" {
				return printStatus(e.Stdout, c.output, st)
			}
			return nil
		},
	}
	c.register(cmd, true)
	fs := cmd.Flags()
	fs.StringVar(&source, "source", "", "where the model's files are: s3://bucket/prefix/, hf://org/model[@revision][/subdir] (a Hub revision is pinned to its commit), magnet:?xt=urn:btih:HASH, or a .torrent as torrent+https://URL, torrent+s3://BUCKET/KEY or torrent+file:///PATH")
	fs.StringVar(&revision, "revision", "", "revision label (the cache also keys on every object's ETag and version)")
	fs.BoolVar(&wait, "wait", false, "wait until the cache is ready on this node")
	fs.DurationVar(&timeout, "timeout", 0, "with --wait: give up after this long, exit 4 (0 = never)")
	fs.Var(&selector, "selector", "only nodes with this label k=v (repeatable)")
	fs.Var(&include, "include", "only files matching this pattern, e.g. '*.safetensors' (a pattern with '/' matches the path, one without the base name; repeatable)")
	fs.Var(&exclude, "exclude", "no files matching this pattern (after --include; repeatable)")
	fs.IntVar(&nodes, "nodes", 0, "only this many of the eligible nodes (0 = all)")
	fs.BoolVar(&pin, "pin", false, "never evict this cache to make room for another")
	fs.IntVar(&priority, "priority", 0, fmt.Sprintf("eviction rank, %d..%d: the cache may evict only caches of this priority or lower, lowest first", -spec.MaxPriority, spec.MaxPriority))
	return cmd
}

// errTimeout marks a wait that ran out of time: exit code 4.
var errTimeout = errors.New("timed out")

// waitReady polls the daemon until the cache is ready, showing progress: a
// bar redrawn in place on a terminal, a plain line every few seconds
// elsewhere. It returns early, with the reason, when the cache will not
// become ready here without help (see waitVerdict), and after timeout (if
// not 0) with where the cache stands: never the daemon client's own
// deadline error, which reads as if the daemon were down.
func waitReady(ctx context.Context, e *Env, cl *api.Client, name string, timeout time.Duration) (api.CacheStatus, error) {
	p := newProgress(e.Stderr)
	defer p.stop()
	var lastErr string
	check := func(st api.CacheStatus) (bool, error) {
		p.update(st)
		done, err := waitVerdict(st)
		if done {
			if err == nil {
				p.done(st)
			}
			return true, err
		}
		if st.State == api.StateFailed && st.Error != lastErr {
			lastErr = st.Error
			p.note(fmt.Sprintf("attempt %d failed (will retry): %s", st.Attempts, st.Error))
		}
		return false, nil
	}
	ended := func(st api.CacheStatus, signalled bool) error {
		if signalled {
			return fmt.Errorf("stopped waiting for %s: %w (%s)", name, context.Cause(ctx), standing(st))
		}
		return fmt.Errorf("%w: %s is not ready after %s: %s; the daemon keeps working on it: follow it with `warmfleet cache status %s`",
			errTimeout, name, timeout, standing(st), name)
	}
	return pollCache(ctx, cl, name, timeout, check, ended)
}

// pollCache reads the cache's status every 200 ms until check says the
// wait is over (with its error), or the caller's ctx ends (signalled) or
// timeout (if not 0) passes: then ended says why from the last status
// received, never with the daemon client's own deadline error, which reads
// as if the daemon were down.
func pollCache(ctx context.Context, cl *api.Client, name string, timeout time.Duration,
	check func(api.CacheStatus) (bool, error), ended func(st api.CacheStatus, signalled bool) error) (api.CacheStatus, error) {
	waitCtx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var st api.CacheStatus
	for {
		cur, err := cl.Cache(waitCtx, name)
		switch {
		case err != nil && waitCtx.Err() != nil:
			return st, ended(st, ctx.Err() != nil)
		case err != nil:
			return st, err
		}
		st = cur
		if done, err := check(st); done {
			return st, err
		}
		select {
		case <-waitCtx.Done():
			return st, ended(st, ctx.Err() != nil)
		case <-tick.C:
		}
	}
}

// waitVerdict decides, from one status, whether waiting is over: true with
// nil when the cache is ready, true with the reason when it will not become
// ready on this node without someone acting, false to keep waiting (a
// failure the daemon retries on its own, such as S3 being unreachable).
func waitVerdict(st api.CacheStatus) (bool, error) {
	switch {
	case st.Ready && st.BytesDone >= st.BytesTotal:
		return true, nil
	case st.State == api.StateNotTargeted:
		return true, fmt.Errorf("%s is not targeted at this node (%s), so it will not be cached here: wait on a node the targets select (`warmfleet fleet` lists the nodes and their labels) or change the targets with `warmfleet cache add %s --source ... --selector k=v`",
			st.Name, targetsText(st.Targets), st.Name)
	case st.State == api.StateFailed && st.NeedsAction:
		retry := ""
		if !st.NextTry.IsZero() {
			retry = ", next try at " + st.NextTry.Local().Format(time.TimeOnly)
		}
		return true, fmt.Errorf("%s failed: %s (attempt %d%s): fix the source or the credentials and the daemon picks it up on its next try (`warmfleet cache status %s`), or remove the cache with `warmfleet cache rm %s`",
			st.Name, st.Error, st.Attempts, retry, st.Name, st.Name)
	}
	return false, nil
}

// standing says where a cache stands: state, bytes and the last error.
func standing(st api.CacheStatus) string {
	if st.State == "" {
		return "no status received yet"
	}
	return fmt.Sprintf("state %s, %s of %s (%.0f%%), last error: %s", st.State,
		bytesize.Format(st.BytesDone), bytesize.Format(st.BytesTotal), percent(st.BytesDone, st.BytesTotal), orNone(st.Error))
}

// percent is done as a percentage of total, 0 while the total is unknown.
func percent(done, total int64) float64 {
	if total <= 0 {
		return 0
	}
	return 100 * float64(done) / float64(total)
}

// targetsText renders a spec's targets as the flags that set them.
func targetsText(t spec.Targets) string {
	var parts []string
	keys := make([]string, 0, len(t.Selector))
	for k := range t.Selector {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, "--selector "+k+"="+t.Selector[k])
	}
	if t.Nodes > 0 {
		parts = append(parts, fmt.Sprintf("--nodes %d", t.Nodes))
	}
	if len(parts) == 0 {
		return "no targets given"
	}
	return "targets " + strings.Join(parts, " ")
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
	fmt.Fprintf(p.w, "%s ready: %s (%s) at %s in %s\n", st.Name, st.RevisionID, bytesize.Format(st.BytesTotal),
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
		bytesize.Format(st.BytesDone), bytesize.Format(st.BytesTotal), bytesize.Format(int64(rate)), st.State)
}

func cacheListCommand(e *Env) *cobra.Command {
	return listCommand(e, "ls", "list the fleet's caches and where this node stands on each",
		"  warmfleet cache ls\n  warmfleet cache ls -o json", (*api.Client).Caches, printTable)
}

// listCommand is a client command that takes no arguments, gets one value
// from the daemon and prints it as -o says.
func listCommand[T any](e *Env, use, short, example string,
	get func(*api.Client, context.Context) (T, error), table func(io.Writer, T) error) *cobra.Command {
	var c clientFlags
	cmd := &cobra.Command{
		Use: use, Short: short, Example: example, Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			v, err := get(cl, cmd.Context())
			if err != nil {
				return err
			}
			return printOut(e.Stdout, c.output, v, table)
		},
	}
	c.register(cmd, true)
	return cmd
}

// nameCommand is a client command on one named thing (arg, as "model
// NAME"): run gets the client and the name.
func nameCommand(use, arg, short, example string, withOutput bool, run func(ctx context.Context, c *clientFlags, cl *api.Client, name string) error) *cobra.Command {
	c := &clientFlags{}
	cmd := &cobra.Command{
		Use: use, Short: short, Example: example, Args: exactArgs(arg),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			return run(cmd.Context(), c, cl, args[0])
		},
	}
	c.register(cmd, withOutput)
	return cmd
}

func cacheStatusCommand(e *Env) *cobra.Command {
	return nameCommand("status NAME", "model NAME", "show where this node stands on one cache",
		"  warmfleet cache status llama\n  warmfleet cache status llama -o json", true,
		func(ctx context.Context, c *clientFlags, cl *api.Client, name string) error {
			st, err := cl.Cache(ctx, name)
			if err != nil {
				return err
			}
			return printStatus(e.Stdout, c.output, st)
		})
}

func cacheRemoveCommand(e *Env) *cobra.Command {
	return nameCommand("rm NAME", "model NAME", "remove a cache from the fleet (every node deletes its files)",
		"  warmfleet cache rm llama", false,
		func(ctx context.Context, _ *clientFlags, cl *api.Client, name string) error {
			if err := cl.RemoveCache(ctx, name); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "%s removed\n", name)
			return nil
		})
}

func printStatus(w io.Writer, format string, st api.CacheStatus) error {
	return printOut(w, format, st, func(w io.Writer, st api.CacheStatus) error {
		return printTable(w, []api.CacheStatus{st})
	})
}

func printTable(w io.Writer, all []api.CacheStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tREADY\tPROGRESS\tSIZE\tPIN\tPRIORITY\tREVISION\tPATH\tERROR")
	for _, st := range all {
		rev := st.RevisionID
		if st.Commit != "" {
			rev += " @" + st.Commit // the Hub commit or torrent info hash every file was read at
		}
		fmt.Fprintf(tw, "%s\t%s\t%t\t%.0f%%\t%s\t%t\t%d\t%s\t%s\t%s\n", st.Name, st.State, st.Ready, percent(st.BytesDone, st.BytesTotal),
			bytesize.Format(st.BytesTotal), st.Pin, st.Priority, rev, st.Path, st.Error)
	}
	return tw.Flush()
}
