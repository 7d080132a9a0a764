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
//
// With Options.Origin "hf" the model comes from a Hugging Face Hub
// (internal/testutil/hubserver, its API and CDN) on the S3 host, on the
// same shaped link, instead of S3: hf:// caches pinned to its commit. The
// figures named after S3 (s3_bytes, s3_egress_ratio, the S3 link) then
// describe the Hub, the origin.
package fleetbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/s3fault"
	"github.com/warmfleet/warmfleet/internal/testutil/hubserver"
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
	// Origin is where the model comes from: "s3" (the default) or "hf", a
	// Hub on the S3 host (see the package doc).
	Origin string
	// S3KeepAlive puts a keep-alive HTTP front (s3fault's proxy, no fault
	// armed) before versitygw, which ends every response with Connection:
	// close: the daemons then open one connection per ranged GET, where
	// against S3 (and the Hub's CDN) a connection serves many. Origin s3
	// only.
	S3KeepAlive bool
	// DaemonArgs go to every daemon in every mode.
	DaemonArgs []string
	// DaemonEnv is added to every daemon's environment (a lab hook's
	// setting, say: netlab passes no WARMFLEET_* variable of its own).
	DaemonEnv []string
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
	// Dir keeps data and logs (made if missing); default a temporary
	// directory removed at the end.
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
	// Dials are the peer handshakes the host dialed (each one a TLS and
	// an identity handshake on both ends), and NotOpen the subscriptions
	// a member answered with not open there (each a dial, and another a
	// second later). Null: the daemon does not export them.
	Dials   *int64 `json:"dials,omitempty"`
	NotOpen *int64 `json:"not_open,omitempty"`
	// Timeline has the bytes the host received over its link since the
	// warm-up began, sampled every Options.SampleEvery.
	Timeline []Sample `json:"timeline,omitempty"`
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
	// Origin is Options.Origin: s3 or hf.
	Origin string `json:"origin"`
	// S3KeepAlive is Options.S3KeepAlive.
	S3KeepAlive bool  `json:"s3_keep_alive,omitempty"`
	ModelBytes  int64 `json:"model_bytes"`
	Files       int   `json:"files"`
	Runs        int   `json:"runs"`

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

	// PageCache is what writing through this machine's page cache costs,
	// measured before the runs (see PageCache).
	PageCache *PageCache `json:"page_cache,omitempty"`

	Modes []ModeResult `json:"modes"`
}

const (
	modeSwarm = "swarm"
	modeNaive = "naive"

	originS3  = "s3"
	originHub = "hf"
)

// Ports of the Hub and its CDN on the S3 host (versitygw has 9000-9001).
const (
	hubPort = 8080
	cdnPort = 8081
)

// seedModel puts the model on the origin opts names and returns it with a
// function that stops what it started. A Hub is started on the S3 host,
// and every daemon is pointed at it (opts.DaemonArgs).
func seedModel(ctx context.Context, lab *netlab.Lab, opts *Options) (netlab.Model, func(), error) {
	if opts.Origin == originS3 {
		m, err := lab.S3().SeedModel(ctx, "bench", "model/", opts.Files, opts.ModelSize, 1)
		return m, func() {}, err
	}
	h := lab.S3().Host
	hubLn, err := h.NS.Listen("tcp", h.Addr(hubPort))
	if err != nil {
		return netlab.Model{}, nil, err
	}
	cdnLn, err := h.NS.Listen("tcp", h.Addr(cdnPort))
	if err != nil {
		hubLn.Close()
		return netlab.Model{}, nil, err
	}
	hub := hubserver.Start(hubLn, cdnLn)
	m, data, err := netlab.ModelData(opts.Files, opts.ModelSize, 1)
	if err != nil {
		hub.Close()
		return netlab.Model{}, nil, err
	}
	files := map[string]hubserver.File{}
	for name, b := range data {
		files[name] = hubserver.File{Data: b, LFS: true}
	}
	hub.Push("bench/model", "main", files)
	m.URL = "hf://bench/model"
	opts.DaemonArgs = append(slices.Clip(opts.DaemonArgs), "--hf-endpoint", hub.Endpoint())
	return m, hub.Close, nil
}

// s3Front is the lab's S3Front for o: a proxy that keeps connections
// alive, or nil.
func (o *Options) s3Front() func(string) (http.Handler, error) {
	if !o.S3KeepAlive {
		return nil
	}
	return func(target string) (http.Handler, error) { return s3fault.New(target) }
}

// originBytesMetric is the daemon's counter of bytes read from the origin.
func (o *Options) originBytesMetric() string {
	if o.Origin == originHub {
		return `warmfleet_origin_bytes_total{source="hf"}`
	}
	return "warmfleet_s3_bytes_total"
}

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
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		// A --dir that does not exist yet is made rather than refused: the
		// page cache probe and netlab write inside it.
		return Result{}, fmt.Errorf("bench fleet: keep data in %s: %w", dir, err)
	}
	pc, err := measurePageCache(ctx, dir, min(pageCacheProbe, opts.ModelSize), opts.Settle)
	if err != nil {
		return Result{}, err
	}
	lab, err := netlab.New(ctx, netlab.Options{
		Hosts: opts.Hosts, Link: opts.Link, S3: true, S3Link: opts.S3Link, MTU: opts.MTU,
		Versitygw: opts.Versitygw, Dir: dir, Logger: log, S3Front: opts.s3Front(),
	})
	if err != nil {
		return Result{}, err
	}
	defer lab.Close()

	log.Info("bench fleet: seeding model", "origin", opts.Origin, "size", netlab.Size(opts.ModelSize), "files", opts.Files)
	model, closeOrigin, err := seedModel(ctx, lab, &opts)
	if err != nil {
		return Result{}, err
	}
	defer closeOrigin()

	swarmLB, naiveLB := LowerBounds(opts.Hosts, opts.ModelSize, opts.Link, opts.S3Link)
	res := Result{
		Hosts: opts.Hosts, HostProcs: opts.HostProcs, SettleSeconds: opts.Settle.Seconds(), Link: opts.Link.String(), S3Link: opts.S3Link.String(), MTU: opts.MTU, Origin: opts.Origin, S3KeepAlive: opts.S3KeepAlive,
		ModelBytes: opts.ModelSize, Files: opts.Files, Runs: opts.Runs,
		LowerBoundSeconds: swarmLB.Seconds(), NaiveLowerBoundSeconds: naiveLB.Seconds(), PageCache: &pc,
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
	switch o.Origin {
	case "":
		o.Origin = originS3
	case originS3, originHub:
	default:
		return fmt.Errorf("bench fleet: origin %q: want %s or %s", o.Origin, originS3, originHub)
	}
	if o.S3KeepAlive && o.Origin != originS3 {
		return fmt.Errorf("bench fleet: keeping S3 connections alive applies to origin %s, not %s (the Hub's CDN keeps them alive)", originS3, o.Origin)
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
