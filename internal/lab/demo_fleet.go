package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/s3origin"
)

// demoFleet is the demo's fleet: daemons in this process, on loopback,
// each with its own data directory and API socket under dir, joined by
// gossip with one cluster key and swarming over their peer listeners.
type demoFleet struct {
	dir, keyFile string
	origin       s3origin.Options
	logOut       io.Writer // the daemons' log (io.Discard unless -v)
	nodes        []*demoNode
}

// demoNode is one daemon of the demo's fleet.
type demoNode struct {
	name, api, dataDir string
	gossipAddr         string // where others join it, once started
	cl                 *api.Client
	stop               context.CancelFunc
	done               chan error
}

// newDemoFleet writes a fresh cluster key under dir.
func newDemoFleet(dir string, origin s3origin.Options, logOut io.Writer) (*demoFleet, error) {
	key, err := gossip.GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("cluster key: %w", err)
	}
	f := &demoFleet{dir: dir, keyFile: filepath.Join(dir, "cluster.key"), origin: origin, logOut: logOut}
	if err := os.WriteFile(f.keyFile, []byte(gossip.EncodeKey(key)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("cluster key: %w", err)
	}
	return f, nil
}

// start runs one more daemon, named node-N, joining the first one's gossip
// address (the first joins nobody), and returns once its API listens.
func (f *demoFleet) start(ctx context.Context) (*demoNode, error) {
	n := &demoNode{name: fmt.Sprintf("node-%d", len(f.nodes)+1), done: make(chan error, 1)}
	n.dataDir = filepath.Join(f.dir, n.name)
	n.api = "unix://" + filepath.Join(n.dataDir, "api.sock")
	if err := os.MkdirAll(n.dataDir, 0o700); err != nil {
		return nil, err
	}
	args := []string{
		"--node-name", n.name, "--data-dir", n.dataDir, "--api", n.api,
		"--reserve", "0", "--reserve-fraction", "0", "--containerd", "off",
		"--gossip", "127.0.0.1:0", "--cluster-key-file", f.keyFile, "--p2p", "127.0.0.1:0",
	}
	if len(f.nodes) > 0 {
		args = append(args, "--join", f.nodes[0].gossipAddr)
	}
	ctx, n.stop = context.WithCancel(ctx)
	started := make(chan struct{})
	// No WARMFLEET_* settings: the demo's daemons are the ones described here.
	env := &cli.Env{Stdout: f.logOut, Stderr: f.logOut, Getenv: func(string) string { return "" }}
	go func() { n.done <- cli.ServeDaemon(ctx, env, args, f.origin, func() { close(started) }) }()
	select {
	case <-started:
	case err := <-n.done:
		n.stop()
		return nil, fmt.Errorf("%s: %w", n.name, err)
	}
	f.nodes = append(f.nodes, n)
	cl, err := api.NewClient(n.api, "")
	if err != nil {
		return nil, err
	}
	n.cl = cl
	fl, err := cl.Fleet(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.name, err)
	}
	for _, m := range fl.Members {
		if m.Self {
			n.gossipAddr = m.Addr
		}
	}
	if n.gossipAddr == "" {
		return nil, fmt.Errorf("%s is not in a gossip cluster", n.name)
	}
	return n, nil
}

// waitMembers waits until every node sees every other one alive.
func (f *demoFleet) waitMembers(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		missing := ""
		for _, n := range f.nodes {
			fl, err := n.cl.Fleet(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", n.name, err)
			}
			if alive := aliveNodes(fl); alive != len(f.nodes) {
				missing = fmt.Sprintf("%s sees %d of %d nodes alive", n.name, alive, len(f.nodes))
				break
			}
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gossip did not join the fleet within %s: %s", timeout, missing)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// aliveNodes counts the daemons (not routers) a fleet view holds alive.
func aliveNodes(fl api.Fleet) int {
	alive := 0
	for _, m := range fl.Members {
		if m.Role == string(gossip.RoleNode) && m.State == string(gossip.MemberAlive) {
			alive++
		}
	}
	return alive
}

// stopAll stops every daemon at once, as a fleet-wide SIGTERM does, and
// returns their errors.
func (f *demoFleet) stopAll() error {
	for _, n := range f.nodes {
		n.stop()
	}
	var errs []error
	for _, n := range f.nodes {
		if err := <-n.done; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
		}
	}
	return errors.Join(errs...)
}

// nodeProgress is where one node's copy of the model stands.
type nodeProgress struct {
	node       string
	state      string
	ready      bool
	done       int64 // bytes of the model on disk
	total      int64
	s3, peers  int64 // bytes this node read from S3 and received from peers
	needsError string
}

// sample reads a node's cache status and its S3 and peer byte counters.
func (n *demoNode) sample(ctx context.Context, model string) (nodeProgress, error) {
	p := nodeProgress{node: n.name, state: "waiting"}
	st, err := n.cl.Cache(ctx, model)
	switch {
	case api.IsNotFound(err):
		// The spec has not reached this node through gossip yet.
	case err != nil:
		return p, fmt.Errorf("%s: %w", n.name, err)
	default:
		p.state, p.ready, p.done, p.total = st.State, st.Ready && st.BytesDone >= st.BytesTotal, st.BytesDone, st.BytesTotal
		if st.NeedsAction {
			p.needsError = st.Error
		}
	}
	text, err := n.cl.Metrics(ctx)
	if err != nil {
		return p, fmt.Errorf("%s: metrics: %w", n.name, err)
	}
	p.s3 = int64(metricNumber(text, "warmfleet_s3_bytes_total"))
	p.peers = int64(metricNumber(text, `warmfleet_peer_bytes_total{direction="in"}`))
	return p, nil
}

// row renders one node's progress line; width 0 leaves the bar out (plain
// output, one line per event).
func (p nodeProgress) row(width int) string {
	frac := min(1, float64(p.done)/float64(max(p.total, 1)))
	bar := ""
	if width > 0 {
		bar = fmt.Sprintf("[%-*s] ", width, strings.Repeat("=", int(frac*float64(width))))
	}
	state := p.state
	if p.ready {
		state = "ready"
	}
	return fmt.Sprintf("  %-7s %s%3.0f%%  from S3 %9s  from peers %9s  %s", p.node, bar, frac*100,
		bytesize.Format(p.s3), bytesize.Format(p.peers), state)
}

// plainDue decides whether plain output (not a terminal) prints a node's
// line: when its state changes or its progress passes a quarter.
func plainDue(prev, cur nodeProgress, first bool) bool {
	if first || prev.state != cur.state || prev.ready != cur.ready {
		return true
	}
	quarter := func(p nodeProgress) int64 {
		if p.total <= 0 {
			return 0
		}
		return 4 * p.done / p.total
	}
	return quarter(prev) != quarter(cur)
}

// progressView draws every node's line: redrawn in place on a terminal,
// else printed as plain lines when plainDue says so.
type progressView struct {
	w     io.Writer
	tty   bool
	drawn int // lines drawn on the terminal last time
	last  map[string]nodeProgress
}

func (v *progressView) show(rows []nodeProgress) {
	if v.tty {
		if v.drawn > 0 {
			fmt.Fprintf(v.w, "\x1b[%dA", v.drawn)
		}
		for _, p := range rows {
			fmt.Fprintf(v.w, "\r\x1b[K%s\n", p.row(24))
		}
		v.drawn = len(rows)
		return
	}
	if v.last == nil {
		v.last = map[string]nodeProgress{}
	}
	for _, p := range rows {
		prev, seen := v.last[p.node]
		if plainDue(prev, p, !seen) {
			fmt.Fprintln(v.w, p.row(0))
		}
		v.last[p.node] = p
	}
}

// waitSwarm polls the nodes until every one holds the model ready, showing
// their progress, and returns the last sample of each.
func waitSwarm(ctx context.Context, nodes []*demoNode, model string, view *progressView, timeout time.Duration) ([]nodeProgress, error) {
	deadline := time.Now().Add(timeout)
	for {
		rows := make([]nodeProgress, 0, len(nodes))
		ready := 0
		for _, n := range nodes {
			p, err := n.sample(ctx, model)
			if err != nil {
				return nil, err
			}
			if p.needsError != "" {
				return nil, fmt.Errorf("%s cannot cache %s: %s", n.name, model, p.needsError)
			}
			if p.ready {
				ready++
			}
			rows = append(rows, p)
		}
		view.show(rows)
		if ready == len(nodes) {
			return rows, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s is ready on %d of %d nodes after %s", model, ready, len(nodes), timeout)
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// metricNumber finds one sample (name with its labels, as exposed) in a
// Prometheus text exposition; 0 when it is absent.
func metricNumber(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return f
			}
		}
	}
	return 0
}

// sleepCtx waits d, or less if ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
