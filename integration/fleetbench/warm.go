package fleetbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
)

// daemonEnv is every daemon's environment: the S3 host's credentials and
// endpoint, Options.HostProcs and Options.DaemonEnv.
func daemonEnv(lab *netlab.Lab, opts Options) []string {
	env := append(lab.S3().Env(), opts.DaemonEnv...)
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
	if err := checkRoom(hosts, model.Size(), args); err != nil {
		return runResult{}, err
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
		s3b, _, err := d.Metric(ctx, opts.originBytesMetric())
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
		for _, c := range []struct {
			metric string
			to     **int64
		}{
			{`warmfleet_peer_handshakes_total{side="dialed"}`, &results[i].Dials},
			{"warmfleet_peer_subscribes_not_open_total", &results[i].NotOpen},
		} {
			if v, found, err := d.Metric(ctx, c.metric); err != nil {
				return runResult{}, err
			} else if found {
				n := int64(v)
				*c.to = &n
			}
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
		if err := checkRoom([]*netlab.Host{h}, model.Size(), args); err != nil {
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
		s3b, _, err := d.Metric(ctx, opts.originBytesMetric())
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
