package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/lab/s3embed"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/synthmodel"
	"golang.org/x/term"
)

// The demo's model: its name in the fleet and where it sits in S3.
const (
	demoModel  = "demo/llama"
	demoBucket = "models"
	demoPrefix = "demo-llama/"
)

// demoTimeout bounds each wait of the demo (gossip joining, a model
// becoming ready), so a fault ends it with an error rather than a hang.
const demoTimeout = 5 * time.Minute

// runDemo tells warmfleet's story on one machine with nothing installed:
// an S3 server embedded in this process with a synthetic model in it; a
// fleet of daemons on loopback, joined by gossip with a fresh cluster key;
// the model read from S3 once and swarmed between the nodes (a live line
// per node: bytes from S3 and from peers), each copy checked against the
// source, and the S3 egress ratio; then a simulated inference server per
// node behind the router, the same requests sent through the random and
// the prefix-aware strategy side by side; and a late node that fills from
// its peers alone. With --keep the fleet stays up, and the demo says how to
// talk to it, until interrupted.
func runDemo(ctx context.Context, e *cli.Env, args []string) error {
	fs := cli.NewFlagSet(e, "demo")
	var size cli.ByteSize = 256 << 20
	fs.Var(&size, "model-size", "size of the synthetic model's weights")
	shards := fs.Int("shards", 4, "safetensors files of the model (config.json and the index come with them)")
	nodes := fs.Int("nodes", 4, "daemons in the fleet at first (a late one joins at the end)")
	dataDir := fs.String("data-dir", "", "directory for the nodes' data, sockets and the cluster key (default: a temporary one, removed at the end)")
	docs := fs.Int("documents", 8, "documents whose questions go through the router (4 questions each, per strategy)")
	keep := fs.Bool("keep", false, "leave the fleet, the router and S3 running, and print how to reach them, until interrupted")
	verbose := fs.Bool("v", false, "show the daemons' and the routers' logs on stderr")
	if err := cli.ParseFlags(fs, e, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError("unexpected arguments %q", fs.Args())
	}
	if *nodes < 2 || *nodes > 16 {
		return cli.UsageError("--nodes %d: want 2..16 (the fleet runs in this process)", *nodes)
	}
	if *docs < 1 || *docs > 64 {
		return cli.UsageError("--documents %d: want 1..64", *docs)
	}
	model, err := synthmodel.New(synthmodel.Options{Seed: 1, Size: int64(size), Shards: *shards, Name: "demo-llama"})
	if err != nil {
		return cli.UsageError("%v", err)
	}
	dir := *dataDir
	if dir == "" {
		work, err := os.MkdirTemp("", "warmfleet-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(work)
		dir = work
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	logOut := io.Discard
	if *verbose {
		logOut = e.Stderr
	}
	d := &demo{e: e, model: model, logOut: logOut, keep: *keep, docs: *docs}
	return d.run(ctx, dir, *nodes)
}

// demo is one run of the demo.
type demo struct {
	e      *cli.Env
	model  *synthmodel.Model
	logOut io.Writer
	keep   bool
	docs   int // documents asked about through the router
}

func (d *demo) say(format string, a ...any) { fmt.Fprintf(d.e.Stdout, "==> "+format+"\n", a...) }

func (d *demo) run(ctx context.Context, dir string, nodes int) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	begin := time.Now()

	srv, err := s3embed.Start(ctx, "127.0.0.1:0", s3embed.Options{Seed: func(ctx context.Context, srv *s3embed.Server) error {
		return seedModel(ctx, srv, map[string]bool{}, demoBucket, demoPrefix, d.model)
	}})
	if err != nil {
		return err
	}
	defer srv.Close()
	files := d.model.Files()
	d.say("an S3 server in this process (%s) holds a synthetic model at s3://%s/%s: %d files (%d safetensors), %s",
		srv.Endpoint(), demoBucket, demoPrefix, len(files), countSuffix(files, ".safetensors"), bytesize.Format(d.model.TotalSize()))

	fleet, err := newDemoFleet(dir, s3origin.Options{Endpoint: srv.Endpoint(), Credentials: srv.Credentials(), Region: s3embed.Region}, d.logOut)
	if err != nil {
		return err
	}
	defer func() {
		if serr := fleet.stopAll(); serr != nil && err == nil {
			err = serr
		}
	}()
	for range nodes {
		if _, err := fleet.start(ctx); err != nil {
			return err
		}
	}
	if err := fleet.waitMembers(ctx, demoTimeout); err != nil {
		return err
	}
	d.say("%d nodes ready on loopback (%s), joined by gossip encrypted with a fresh cluster key, each with a peer-to-peer listener",
		nodes, nodeNames(fleet.nodes))

	first := fleet.nodes[0]
	if _, err := first.cl.AddCache(ctx, api.AddCacheRequest{Name: demoModel, Source: "s3://" + demoBucket + "/" + demoPrefix}); err != nil {
		return err
	}
	d.say("warmfleet cache add %s --source s3://%s/%s   (on %s: the spec reaches every node by gossip; each shard is read from S3 once and swarmed)",
		demoModel, demoBucket, demoPrefix, first.name)
	start := time.Now()
	rows, err := waitSwarm(ctx, fleet.nodes, demoModel, d.view(), demoTimeout)
	if err != nil {
		return err
	}
	swarmTime := time.Since(start)
	for _, n := range fleet.nodes {
		if err := d.verify(ctx, n); err != nil {
			return err
		}
	}
	var s3Bytes, peerBytes int64
	for _, r := range rows {
		s3Bytes += r.s3
		peerBytes += r.peers
	}
	total := d.model.TotalSize()
	d.say("ready on all %d nodes in %s; every file on every node checked byte for byte against the source",
		nodes, swarmTime.Round(100*time.Millisecond))
	d.say("S3 egress ratio %.2f: %s read from S3 for a %s model (%d nodes reading it all from S3 would be %d.00); %s came from peers",
		float64(s3Bytes)/float64(total), bytesize.Format(s3Bytes), bytesize.Format(total), nodes, nodes, bytesize.Format(peerBytes))

	sims, err := startSims(ctx, fleet.nodes, demoModel)
	defer func() {
		for _, s := range sims {
			_ = s.srv.Close()
		}
	}()
	if err != nil {
		return err
	}
	d.say("a simulated vLLM server per node, registered as its endpoint of %s (warmfleet endpoint add); a router joins the gossip and learns them",
		demoModel)
	results, rt, err := compareStrategies(ctx, sims, demoModel, first.gossipAddr, fleet.keyFile, dir, d.docs, d.logOut)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := rt.stop(); rerr != nil && err == nil {
			err = rerr
		}
	}()
	d.say("the same %d requests (%d documents, %d questions each, asked in turn) through the router, on cold servers for each strategy:",
		d.docs*demoQuestions, d.docs, demoQuestions)
	writeComparison(d.e.Stdout, results)

	late, err := fleet.start(ctx)
	if err != nil {
		return err
	}
	d.say("%s joins the warm fleet late", late.name)
	start = time.Now()
	lateRows, err := waitSwarm(ctx, []*demoNode{late}, demoModel, d.view(), demoTimeout)
	if err != nil {
		return err
	}
	if err := d.verify(ctx, late); err != nil {
		return err
	}
	d.say("late node %s: ready in %s, %d bytes from S3, %s from peers",
		late.name, time.Since(start).Round(100*time.Millisecond), lateRows[0].s3, bytesize.Format(lateRows[0].peers))
	d.say("done in %s", time.Since(begin).Round(100*time.Millisecond))
	if d.keep {
		d.printKeep(fleet, srv, rt)
		<-ctx.Done()
	}
	return nil
}

// view returns a progress view on stdout: redrawn in place on a terminal,
// plain lines otherwise.
func (d *demo) view() *progressView {
	f, ok := d.e.Stdout.(*os.File)
	return &progressView{w: d.e.Stdout, tty: ok && term.IsTerminal(int(f.Fd()))}
}

// verify checks a node's copy of the model against the source.
func (d *demo) verify(ctx context.Context, n *demoNode) error {
	st, err := n.cl.Cache(ctx, demoModel)
	if err != nil {
		return fmt.Errorf("%s: %w", n.name, err)
	}
	if err := checkDemo(st, d.model); err != nil {
		return fmt.Errorf("verification on %s: %w", n.name, err)
	}
	return nil
}

// printKeep says how to talk to the fleet left running.
func (d *demo) printKeep(fleet *demoFleet, srv *s3embed.Server, rt *demoRouter) {
	w := d.e.Stdout
	fmt.Fprintf(w, "\nThe fleet keeps running until you press Ctrl-C. From another shell:\n")
	fmt.Fprintf(w, "  export %s\n", strings.Join(srv.Env(), " "))
	fmt.Fprintf(w, "  export WARMFLEET_API=%s\n", fleet.nodes[0].api)
	fmt.Fprintf(w, "  warmfleet fleet                      # members, health, what each holds\n")
	fmt.Fprintf(w, "  warmfleet cache status %s\n", demoModel)
	fmt.Fprintf(w, "  curl -s %s/v1/models                 # the router (prefix-aware)\n", rt.base)
	fmt.Fprintf(w, "  open %s/ui                           # the router's status page\n", rt.admin)
	fmt.Fprintf(w, "The nodes' API sockets and data directories:\n")
	for _, n := range fleet.nodes {
		fmt.Fprintf(w, "  %-7s %s  %s\n", n.name, n.api, n.dataDir)
	}
	fmt.Fprintf(w, "The cluster key: %s\n", fleet.keyFile)
}

func nodeNames(nodes []*demoNode) string {
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.name
	}
	return strings.Join(names, ", ")
}

func countSuffix(files []synthmodel.File, suffix string) int {
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f.Name, suffix) {
			n++
		}
	}
	return n
}

// checkDemo checks the cached revision against the synthetic model: every
// file present, parseable and byte-identical.
func checkDemo(st api.CacheStatus, model *synthmodel.Model) error {
	if !st.Ready {
		return fmt.Errorf("cache not ready: %+v", st)
	}
	for _, f := range model.Files() {
		path := filepath.Join(st.Path, f.Name)
		if strings.HasSuffix(f.Name, ".safetensors") {
			if _, err := synthmodel.CheckFile(path); err != nil {
				return err
			}
		}
		if err := sameContent(path, f.Open()); err != nil {
			return fmt.Errorf("%s: %w", f.Name, err)
		}
	}
	return nil
}

func sameContent(path string, want io.Reader) error {
	got, err := os.Open(path)
	if err != nil {
		return err
	}
	defer got.Close()
	a, b := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); ; {
		n, errA := io.ReadFull(got, a)
		m, errB := io.ReadFull(want, b)
		if n != m || string(a[:n]) != string(b[:m]) {
			return fmt.Errorf("differs from the source near byte %d", off)
		}
		off += int64(n)
		if errA != nil || errB != nil {
			if (errA == io.EOF || errA == io.ErrUnexpectedEOF) && (errB == io.EOF || errB == io.ErrUnexpectedEOF) {
				return nil
			}
			return errors.Join(errA, errB)
		}
	}
}
