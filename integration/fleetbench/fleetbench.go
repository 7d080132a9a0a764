// Package fleetbench measures how fast a fleet of warmfleet daemons gets
// warm: it builds a netlab topology (N hosts and an S3 host on shaped
// links), seeds a model into S3, starts a daemon per host, caches the model
// on every host at once and reports per-host and fleet figures against the
// link-rate lower bound. It backs `warmfleet-lab bench fleet` and needs root.
//
// Two modes run in the same run, each from empty disks:
//
//   - swarm (Options.SwarmArgs: gossip, a shared cluster key and --p2p):
//     the product. Each shard leaves S3 once, fetched by one origin host,
//     and the others fill from peers, so the fleet's S3 egress is about one
//     model and every host reports the bytes it got from peers. Its figures
//     are the Result's top-level ones; with ScaleOut, a last host also
//     joins the warm others.
//   - naive (Options.NaiveArgs): every host reads the whole model from S3,
//     the baseline the swarm's speedup is measured against.
//
// Leaving SwarmArgs nil measures the naive mode alone and reports the swarm
// as not measured; SkipNaive measures the swarm alone.
package fleetbench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
)

// Options configure a fleet benchmark.
type Options struct {
	Hosts     int
	Link      netlab.Rate // every host's link, both directions
	S3Link    netlab.Rate // the S3 host's link; zero means Link
	MTU       int         // every link's MTU; zero keeps 1500
	ModelSize int64
	Files     int
	// Runs per mode; the figures are medians. Default 1.
	Runs int
	// Bin is the warmfleet binary the hosts run.
	Bin string
	// Versitygw is the S3 server binary; default from PATH.
	Versitygw string
	// DaemonArgs go to every daemon in every mode.
	DaemonArgs []string
	// SwarmArgs turn the daemon's peer-to-peer swarm on (gossip, the
	// cluster key and --p2p). Nil leaves the swarm mode out: it is reported
	// as not measured.
	SwarmArgs []string
	// NaiveArgs make the daemon fetch from S3 only (the baseline).
	NaiveArgs []string
	// SkipNaive leaves the baseline out (it takes hosts times longer).
	SkipNaive bool
	// ScaleOut also measures, with the swarm, the last host joining the
	// others once they are warm.
	ScaleOut bool
	// In every daemon argument, {ip} becomes the host's address, {seed}
	// the first host's, and {keyfile} ClusterKeyFile: gossip and the swarm
	// need per-host addresses and a shared key.
	ClusterKeyFile string
	// PeerBytesMetric is the daemon's counter of bytes received from peers;
	// default warmfleet_peer_bytes_total{direction="in"}. A daemon without
	// it reports null.
	PeerBytesMetric string
	// RunTimeout bounds one warm-up; default scales with the naive lower
	// bound.
	RunTimeout time.Duration
	// SampleEvery, if set, samples every host's received bytes at this
	// interval into HostResult.Timeline (for WriteSVG).
	SampleEvery time.Duration
	// HostProcs, if positive, is every daemon's GOMAXPROCS. The hosts share
	// the machine's cores, so each has a fraction of one, as a DaemonSet
	// under a CPU limit would (Go sets GOMAXPROCS from the cgroup limit).
	HostProcs int
	// Settle pauses before each warm-up, once the previous run's data is
	// deleted, as the benchmark method asks, so no run starts in
	// the last one's wake. On the 2-core test VM runs measured slower with
	// the pause than back to back (0); why is not established (a guess:
	// the VM reclaims the page cache the last run freed).
	Settle time.Duration
	// Dir keeps data and logs; default a temporary directory removed at the
	// end.
	Dir    string
	Logger *slog.Logger
}

// HostResult is one host in one run.
type HostResult struct {
	Host         string  `json:"host"`
	ReadySeconds float64 `json:"ready_seconds"`
	S3Bytes      int64   `json:"s3_bytes"`
	PeerBytes    *int64  `json:"peer_bytes"` // null: the daemon does not export it
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	// Timeline has the bytes the host received over its link since the
	// warm-up began, sampled every Options.SampleEvery.
	Timeline []Sample `json:"timeline,omitempty"`
}

// LinkUse is what the S3 host's link sent during a run: the bytes its
// counters saw (retransmissions included; headers once per packet the
// kernel handed the link, which with segmentation offload is fewer than
// on a real wire) and when all but the last 0.1% of them were out. Warm
// time minus BusySeconds is how long the fleet took to spread the last
// bytes read from S3.
type LinkUse struct {
	SentBytes   int64   `json:"sent_bytes"`
	BusySeconds float64 `json:"busy_seconds"`
}

// linkUse reduces a link's cumulative sent bytes, sampled from the start
// of a run, to its LinkUse.
func linkUse(sent []Sample) LinkUse {
	if len(sent) == 0 {
		return LinkUse{}
	}
	total := sent[len(sent)-1].Bytes
	u := LinkUse{SentBytes: total}
	for _, s := range sent {
		if s.Bytes >= total-total/1000 {
			u.BusySeconds = s.Seconds
			break
		}
	}
	return u
}

// s3SampleEvery is how often the S3 host's sent bytes are read in every
// run: finely enough to place the end of its busy time.
const s3SampleEvery = 100 * time.Millisecond

// Sample is a point of a link counter's timeline.
type Sample struct {
	Seconds float64 `json:"t"`
	// Bytes counted since the run began: received, in a host's timeline.
	Bytes int64 `json:"rx_bytes"`
}

// ModeResult sums up one mode over its runs. A mode that is not available
// carries only its reason and lower bound: its figures are left out of the
// JSON rather than reported as zeros.
type ModeResult struct {
	Mode      string `json:"mode"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	// WarmSeconds is the median over runs of the time until the last host
	// was ready.
	WarmSeconds       float64   `json:"warm_seconds,omitempty"`
	RunSeconds        []float64 `json:"run_seconds,omitempty"`
	LowerBoundSeconds float64   `json:"lower_bound_seconds"`
	WarmRatio         float64   `json:"warm_ratio,omitempty"`
	// S3EgressRatio is the bytes read from S3 by the whole fleet over the
	// model size (1 = the model left S3 once).
	S3EgressRatio float64      `json:"s3_egress_ratio,omitempty"`
	PeakRSSBytes  int64        `json:"peak_rss_bytes,omitempty"`
	Hosts         []HostResult `json:"hosts,omitempty"` // of the median run
	// S3Link is the S3 host's link in the median run.
	S3Link *LinkUse `json:"s3_link,omitempty"`
	// Losses are the median run's.
	Losses *Losses `json:"losses,omitempty"`
}

// runResult is one run of one mode.
type runResult struct {
	hosts  []HostResult
	s3     LinkUse
	losses Losses
}

// Losses are what the network lost during a run: the S3 host's TCP
// retransmissions, and the packets the link shapers dropped. A packet the
// kernel handed over whole for segmentation offload counts once as a drop,
// however many segments it held, so drops undercount lost segments.
type Losses struct {
	S3Segments      uint64 `json:"s3_segments"`      // TCP segments the S3 host sent, retransmissions not included
	S3Retransmitted uint64 `json:"s3_retransmitted"` // TCP segments the S3 host sent again
	S3UplinkDrops   uint64 `json:"s3_uplink_drops"`  // dropped on the S3 host's way out
	DownlinkDrops   uint64 `json:"downlink_drops"`   // dropped on the way into the run's hosts, summed
	UplinkDrops     uint64 `json:"uplink_drops"`     // dropped on the way out of the run's hosts, summed
}

// lossCounters are the cumulative counters Losses are the difference of.
type lossCounters struct {
	s3     netlab.TCPCounters
	s3Link netlab.LinkDrops
	hosts  netlab.LinkDrops // summed
}

func readLossCounters(ctx context.Context, lab *netlab.Lab, hosts []*netlab.Host) (lossCounters, error) {
	var c lossCounters
	var err error
	if c.s3, err = lab.S3().TCPCounters(); err != nil {
		return c, err
	}
	if c.s3Link, err = lab.S3().Link().Drops(ctx); err != nil {
		return c, err
	}
	for _, h := range hosts {
		d, err := h.Link().Drops(ctx)
		if err != nil {
			return c, err
		}
		c.hosts.Up += d.Up
		c.hosts.Down += d.Down
	}
	return c, nil
}

// since is what was lost between the counters in before and c.
func (c lossCounters) since(before lossCounters) Losses {
	return Losses{
		S3Segments:      c.s3.OutSegs - before.s3.OutSegs,
		S3Retransmitted: c.s3.RetransSegs - before.s3.RetransSegs,
		S3UplinkDrops:   c.s3Link.Up - before.s3Link.Up,
		DownlinkDrops:   c.hosts.Down - before.hosts.Down,
		UplinkDrops:     c.hosts.Up - before.hosts.Up,
	}
}

// RetransmitShare is the share of the S3 host's segments that were
// retransmissions.
func (l Losses) RetransmitShare() float64 {
	if sent := l.S3Segments + l.S3Retransmitted; sent > 0 {
		return float64(l.S3Retransmitted) / float64(sent)
	}
	return 0
}

// Result is the benchmark's output. Top-level figures without a "naive_"
// prefix describe the product (swarm mode) and are null while it is not
// available.
type Result struct {
	Hosts     int `json:"hosts"`
	HostProcs int `json:"host_procs,omitempty"`
	// SettleSeconds is Options.Settle.
	SettleSeconds float64 `json:"settle_seconds,omitempty"`
	Link          string  `json:"link"`
	MTU           int     `json:"mtu,omitempty"`
	S3Link        string  `json:"s3_link"`
	ModelBytes    int64   `json:"model_bytes"`
	Files         int     `json:"files"`
	Runs          int     `json:"runs"`

	WarmSeconds       *float64 `json:"warm_seconds"`
	LowerBoundSeconds float64  `json:"lower_bound_seconds"`
	WarmRatio         *float64 `json:"warm_ratio"`
	S3EgressRatio     *float64 `json:"s3_egress_ratio"`
	PeakRSSBytes      *int64   `json:"peak_rss_bytes"`

	NaiveWarmSeconds       float64 `json:"naive_warm_seconds"`
	NaiveLowerBoundSeconds float64 `json:"naive_lower_bound_seconds"`
	NaiveWarmRatio         float64 `json:"naive_warm_ratio"`
	NaiveS3EgressRatio     float64 `json:"naive_s3_egress_ratio"`
	NaivePeakRSSBytes      int64   `json:"naive_peak_rss_bytes"`
	// SwarmSpeedup is naive over swarm warm time; null without a swarm.
	SwarmSpeedup *float64 `json:"swarm_speedup"`
	// ScaleOut is the median run of one host joining the others, warm
	// (Options.ScaleOut).
	ScaleOut *ScaleOut `json:"scale_out,omitempty"`

	Modes []ModeResult `json:"modes"`
}

const (
	modeSwarm = "swarm"
	modeNaive = "naive"
)

// Run builds the lab, runs every available mode Options.Runs times
// (interleaved, so drift on a noisy machine hits both alike) and returns the
// figures.
func Run(ctx context.Context, opts Options) (Result, error) {
	if err := opts.defaults(); err != nil {
		return Result{}, err
	}
	log := opts.Logger
	dir := opts.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "warmfleet-bench-fleet-")
		if err != nil {
			return Result{}, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	lab, err := netlab.New(ctx, netlab.Options{
		Hosts: opts.Hosts, Link: opts.Link, S3: true, S3Link: opts.S3Link, MTU: opts.MTU,
		Versitygw: opts.Versitygw, Dir: dir, Logger: log,
	})
	if err != nil {
		return Result{}, err
	}
	defer lab.Close()

	log.Info("bench fleet: seeding model", "size", netlab.Size(opts.ModelSize), "files", opts.Files)
	model, err := lab.S3().SeedModel(ctx, "bench", "model/", opts.Files, opts.ModelSize, 1)
	if err != nil {
		return Result{}, err
	}

	swarmLB, naiveLB := LowerBounds(opts.Hosts, opts.ModelSize, opts.Link, opts.S3Link)
	res := Result{
		Hosts: opts.Hosts, HostProcs: opts.HostProcs, SettleSeconds: opts.Settle.Seconds(), Link: opts.Link.String(), S3Link: opts.S3Link.String(), MTU: opts.MTU,
		ModelBytes: opts.ModelSize, Files: opts.Files, Runs: opts.Runs,
		LowerBoundSeconds: swarmLB.Seconds(), NaiveLowerBoundSeconds: naiveLB.Seconds(),
	}
	modes := []struct {
		name string
		args []string
		lb   time.Duration
	}{{modeNaive, opts.NaiveArgs, naiveLB}}
	if opts.SkipNaive {
		if opts.SwarmArgs == nil {
			return Result{}, errors.New("bench fleet: nothing to measure without the baseline and the swarm")
		}
		modes = modes[:0]
	}
	if opts.SwarmArgs != nil {
		modes = append([]struct {
			name string
			args []string
			lb   time.Duration
		}{{modeSwarm, opts.SwarmArgs, swarmLB}}, modes...)
	}
	runs := map[string][]runResult{}
	for i := range opts.Runs {
		for _, m := range modes {
			timeout := opts.RunTimeout
			if timeout == 0 {
				timeout = 2*m.lb*time.Duration(max(1, opts.Hosts/4)) + 2*time.Minute
			}
			log.Info("bench fleet: run", "mode", m.name, "run", i+1, "of", opts.Runs)
			run, err := warmOnce(ctx, lab, model, opts, slices.Concat(opts.DaemonArgs, m.args), fmt.Sprintf("%s-%d", m.name, i+1), timeout)
			if err != nil {
				return Result{}, fmt.Errorf("%s run %d: %w", m.name, i+1, err)
			}
			runs[m.name] = append(runs[m.name], run)
		}
	}
	if opts.SwarmArgs == nil {
		res.Modes = append(res.Modes, ModeResult{Mode: modeSwarm, Reason: "not measured (no swarm arguments given); only the naive baseline was measured", LowerBoundSeconds: swarmLB.Seconds()})
	}
	for _, m := range modes {
		mr := summarize(m.name, runs[m.name], m.lb, model.Size())
		res.Modes = append(res.Modes, mr)
		switch m.name {
		case modeNaive:
			res.NaiveWarmSeconds, res.NaiveWarmRatio = mr.WarmSeconds, mr.WarmRatio
			res.NaiveS3EgressRatio, res.NaivePeakRSSBytes = mr.S3EgressRatio, mr.PeakRSSBytes
		case modeSwarm:
			res.WarmSeconds, res.WarmRatio, res.S3EgressRatio, res.PeakRSSBytes = &mr.WarmSeconds, &mr.WarmRatio, &mr.S3EgressRatio, &mr.PeakRSSBytes
		}
	}
	if opts.ScaleOut && opts.SwarmArgs != nil && opts.Hosts > 1 {
		var outs []ScaleOut
		for i := range opts.Runs {
			log.Info("bench fleet: scale-out run", "run", i+1, "of", opts.Runs)
			so, err := scaleOutOnce(ctx, lab, model, opts, slices.Concat(opts.DaemonArgs, opts.SwarmArgs), 2*swarmLB*time.Duration(max(1, opts.Hosts/4))+2*time.Minute)
			if err != nil {
				return Result{}, fmt.Errorf("scale-out run %d: %w", i+1, err)
			}
			outs = append(outs, so)
		}
		slices.SortFunc(outs, func(a, b ScaleOut) int { return cmp.Compare(a.Seconds, b.Seconds) })
		res.ScaleOut = &outs[len(outs)/2]
	}
	if res.WarmSeconds != nil && *res.WarmSeconds > 0 && res.NaiveWarmSeconds > 0 {
		s := res.NaiveWarmSeconds / *res.WarmSeconds
		res.SwarmSpeedup = &s
	}
	return res, nil
}

func (o *Options) defaults() error {
	if o.Hosts < 1 || o.Hosts > 200 {
		return fmt.Errorf("bench fleet: %d hosts: want 1 to 200", o.Hosts)
	}
	if o.Link == 0 {
		return errors.New("bench fleet: a link rate is required (the lower bound depends on it)")
	}
	if o.S3Link == 0 {
		o.S3Link = o.Link
	}
	if o.Files < 1 || o.ModelSize < int64(o.Files) {
		return fmt.Errorf("bench fleet: model of %d bytes in %d files: want at least one file and one byte per file", o.ModelSize, o.Files)
	}
	if o.Runs == 0 {
		o.Runs = 1
	}
	if o.Runs < 0 || o.Runs > 100 {
		return fmt.Errorf("bench fleet: %d runs: want 1 to 100", o.Runs)
	}
	if o.Bin == "" {
		return errors.New("bench fleet: no warmfleet binary given")
	}
	if o.PeerBytesMetric == "" {
		o.PeerBytesMetric = `warmfleet_peer_bytes_total{direction="in"}`
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// LowerBounds returns the fastest possible warm-up of hosts hosts, each
// needing size bytes: with a swarm, every host must receive the model over
// its own link and S3 must send it at least once; naive, S3 must send it
// once per host.
func LowerBounds(hosts int, size int64, link, s3Link netlab.Rate) (swarm, naive time.Duration) {
	at := func(bytes float64, r netlab.Rate) time.Duration {
		return time.Duration(bytes / r.BytesPerSecond() * float64(time.Second))
	}
	perHost := at(float64(size), link)
	swarm = max(perHost, at(float64(size), s3Link))
	naive = max(perHost, at(float64(size)*float64(hosts), s3Link))
	return swarm, naive
}

// daemonEnv is every daemon's environment: the S3 host's credentials and
// endpoint, and Options.HostProcs.
func daemonEnv(lab *netlab.Lab, opts Options) []string {
	env := lab.S3().Env()
	if opts.HostProcs > 0 {
		env = append(env, fmt.Sprintf("GOMAXPROCS=%d", opts.HostProcs))
	}
	return env
}

// warmOnce starts a fresh daemon on every host, caches the model on all of
// them at once and collects each host's figures.
func warmOnce(ctx context.Context, lab *netlab.Lab, model netlab.Model, opts Options, args []string, cacheName string, timeout time.Duration) (runResult, error) {
	return warmHosts(ctx, lab, lab.Hosts(), model, opts, args, cacheName, timeout, nil)
}

// warmHosts starts a cold daemon on each of hosts, caches the model on all
// of them and measures; then, if after is not nil, calls it with the
// daemons still running.
func warmHosts(ctx context.Context, lab *netlab.Lab, hosts []*netlab.Host, model netlab.Model, opts Options, args []string, cacheName string, timeout time.Duration, after func(ctx context.Context, args []string) error) (runResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	daemons := make([]*netlab.Daemon, len(hosts))
	defer func() {
		for _, d := range daemons {
			if d != nil {
				_ = d.Stop(10 * time.Second)
			}
		}
	}()
	for _, h := range hosts {
		// Every run starts cold.
		if err := os.RemoveAll(h.DataDir); err != nil {
			return runResult{}, err
		}
		if err := os.MkdirAll(h.DataDir, 0o755); err != nil {
			return runResult{}, err
		}
	}
	select {
	case <-ctx.Done():
		return runResult{}, ctx.Err()
	case <-time.After(opts.Settle):
	}
	for i, h := range hosts {
		d, err := h.StartDaemon(ctx, netlab.DaemonSpec{Bin: opts.Bin, Env: daemonEnv(lab, opts), Args: hostArgs(args, h, hosts[0], opts)})
		if err != nil {
			return runResult{}, err
		}
		daemons[i] = d
	}
	if slices.Contains(args, "--gossip") {
		// The clock starts once the fleet has formed: a node that is alone
		// when the cache is added would rightly fetch everything itself.
		if err := waitFleet(ctx, daemons); err != nil {
			return runResult{}, err
		}
	}
	results := make([]HostResult, len(hosts))
	errs := make([]error, len(hosts))
	lossesBefore, err := readLossCounters(ctx, lab, hosts)
	if err != nil {
		return runResult{}, err
	}
	start := time.Now()
	rx := make([]func() (int64, error), len(hosts))
	for i, h := range hosts {
		rx[i] = linkCounter(h, false)
	}
	stopTimelines := sampleCounters(opts.SampleEvery, start, rx)
	stopS3 := sampleCounters(s3SampleEvery, start, []func() (int64, error){linkCounter(lab.S3().Host, true)})
	var wg sync.WaitGroup
	for i, d := range daemons {
		wg.Go(func() {
			st, err := d.CacheAdd(ctx, cacheName, model.Source())
			results[i].Host, results[i].ReadySeconds = d.Host().Name, time.Since(start).Seconds()
			if err == nil && (!st.Ready || st.Path == "") {
				err = fmt.Errorf("cache add --wait returned state %q, not ready", st.State)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, tl := range stopTimelines() {
		results[i].Timeline = tl
	}
	run := runResult{hosts: results, s3: linkUse(stopS3()[0])}
	if err := errors.Join(errs...); err != nil {
		return runResult{}, err
	}
	lossesAfter, err := readLossCounters(ctx, lab, hosts)
	if err != nil {
		return runResult{}, err
	}
	run.losses = lossesAfter.since(lossesBefore)
	for i, d := range daemons {
		s3b, _, err := d.Metric(ctx, "warmfleet_s3_bytes_total")
		if err != nil {
			return runResult{}, err
		}
		results[i].S3Bytes = int64(s3b)
		if pb, found, err := d.Metric(ctx, opts.PeerBytesMetric); err != nil {
			return runResult{}, err
		} else if found {
			v := int64(pb)
			results[i].PeerBytes = &v
		}
		ps, err := d.Stats()
		if err != nil {
			return runResult{}, err
		}
		results[i].PeakRSSBytes, results[i].CPUSeconds = ps.PeakRSS, ps.CPU.Seconds()
	}
	if after != nil {
		if err := after(ctx, args); err != nil {
			return runResult{}, err
		}
	}
	return run, nil
}

// ScaleOut is one node joining a warm fleet.
type ScaleOut struct {
	Seconds           float64 `json:"seconds"`
	LowerBoundSeconds float64 `json:"lower_bound_seconds"`
	Ratio             float64 `json:"ratio"`
	S3Bytes           int64   `json:"s3_bytes"`
	PeerBytes         int64   `json:"peer_bytes"`
}

// scaleOutOnce warms all hosts but the last, then starts the last one and
// times its cache from peers.
func scaleOutOnce(ctx context.Context, lab *netlab.Lab, model netlab.Model, opts Options, args []string, timeout time.Duration) (ScaleOut, error) {
	hosts := lab.Hosts()
	var out ScaleOut
	_, err := warmHosts(ctx, lab, hosts[:len(hosts)-1], model, opts, args, "scale-out", timeout, func(ctx context.Context, args []string) error {
		h := hosts[len(hosts)-1]
		if err := os.RemoveAll(h.DataDir); err != nil {
			return err
		}
		if err := os.MkdirAll(h.DataDir, 0o755); err != nil {
			return err
		}
		d, err := h.StartDaemon(ctx, netlab.DaemonSpec{Bin: opts.Bin, Env: daemonEnv(lab, opts), Args: hostArgs(args, h, hosts[0], opts)})
		if err != nil {
			return err
		}
		defer func() { _ = d.Stop(10 * time.Second) }() // the figures are taken; a slow exit does not change them
		start := time.Now()
		st, err := d.CacheAdd(ctx, "scale-out", model.Source())
		if err != nil {
			return err
		}
		if !st.Ready {
			return fmt.Errorf("joining host: state %q, not ready", st.State)
		}
		out.Seconds = time.Since(start).Seconds()
		s3b, _, err := d.Metric(ctx, "warmfleet_s3_bytes_total")
		if err != nil {
			return err
		}
		pb, _, err := d.Metric(ctx, opts.PeerBytesMetric)
		if err != nil {
			return err
		}
		out.S3Bytes, out.PeerBytes = int64(s3b), int64(pb)
		return nil
	})
	perHost, _ := LowerBounds(1, opts.ModelSize, opts.Link, opts.Link)
	out.LowerBoundSeconds = perHost.Seconds()
	if out.LowerBoundSeconds > 0 {
		out.Ratio = out.Seconds / out.LowerBoundSeconds
	}
	return out, err
}

// hostArgs fills in a host's {ip}, {seed} and {keyfile}.
func hostArgs(args []string, h, seed *netlab.Host, opts Options) []string {
	r := strings.NewReplacer("{ip}", h.IP.String(), "{seed}", seed.IP.String(), "{keyfile}", opts.ClusterKeyFile)
	out := make([]string, len(args))
	for j, a := range args {
		out[j] = r.Replace(a)
	}
	return out
}

// waitFleet waits until every daemon sees every other alive.
func waitFleet(ctx context.Context, daemons []*netlab.Daemon) error {
	for _, d := range daemons {
		for {
			out, err := d.CLI(ctx, "fleet", "-o", "json")
			var f struct {
				Members []struct {
					State string `json:"state"`
				} `json:"members"`
			}
			alive := 0
			if err == nil && json.Unmarshal(out, &f) == nil {
				for _, m := range f.Members {
					if m.State == "alive" {
						alive++
					}
				}
			}
			if alive == len(daemons) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("fleet did not form: %s sees %d of %d members alive: %w", d.Host().Name, alive, len(daemons), ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// sampleCounters reads each counter every interval from start until the
// returned stop is called; stop returns each counter's samples, counted
// from its first reading. A zero interval samples nothing.
func sampleCounters(every time.Duration, start time.Time, counters []func() (int64, error)) (stop func() [][]Sample) {
	samples := make([][]Sample, len(counters))
	if every <= 0 {
		return func() [][]Sample { return samples }
	}
	base := make([]int64, len(counters))
	for i, read := range counters {
		base[i], _ = read()
	}
	sample := func() {
		t := time.Since(start).Seconds()
		for i, read := range counters {
			if v, err := read(); err == nil {
				samples[i] = append(samples[i], Sample{Seconds: t, Bytes: v - base[i]})
			}
		}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(every)
		defer tick.Stop()
		sample()
		for {
			select {
			case <-done:
				sample()
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	return func() [][]Sample {
		close(done)
		<-finished
		return samples
	}
}

// linkCounter reads one of a host's link counters: its received or its
// sent bytes.
func linkCounter(h *netlab.Host, sent bool) func() (int64, error) {
	return func() (int64, error) {
		c, err := h.Link().Counters(context.Background())
		if sent {
			return int64(c.TxBytes), err
		}
		return int64(c.RxBytes), err
	}
}

// summarize reduces a mode's runs to its median run's figures.
func summarize(mode string, runs []runResult, lb time.Duration, modelSize int64) ModeResult {
	mr := ModeResult{Mode: mode, Available: true, LowerBoundSeconds: lb.Seconds()}
	if len(runs) == 0 {
		return mr
	}
	type run struct {
		warm float64
		runResult
	}
	rs := make([]run, len(runs))
	for i, r := range runs {
		for _, h := range r.hosts {
			rs[i].warm = max(rs[i].warm, h.ReadySeconds)
		}
		rs[i].runResult = r
		mr.RunSeconds = append(mr.RunSeconds, rs[i].warm)
	}
	slices.SortFunc(rs, func(a, b run) int { return cmp.Compare(a.warm, b.warm) })
	med := rs[(len(rs)-1)/2]
	mr.WarmSeconds, mr.Hosts = med.warm, med.hosts
	if med.s3.SentBytes > 0 {
		mr.S3Link = &med.s3
	}
	if med.losses != (Losses{}) {
		mr.Losses = &med.losses
	}
	if lb > 0 {
		mr.WarmRatio = med.warm / lb.Seconds()
	}
	var s3 int64
	for _, h := range med.hosts {
		s3 += h.S3Bytes
		mr.PeakRSSBytes = max(mr.PeakRSSBytes, h.PeakRSSBytes)
	}
	if modelSize > 0 {
		mr.S3EgressRatio = float64(s3) / float64(modelSize)
	}
	return mr
}
