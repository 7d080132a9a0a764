package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/balance"
)

// WriteJSON writes the results as indented JSON.
func WriteJSON(w io.Writer, r *Results) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (wr *WorkloadResult) get(s balance.Strategy) *StrategyResult {
	for i := range wr.Strategies {
		if wr.Strategies[i].Strategy == s {
			return &wr.Strategies[i]
		}
	}
	return nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// WriteText writes a human-readable report with the goals checked.
func WriteText(w io.Writer, r *Results) error {
	o := r.Options
	mode, load := "virtual time, real HTTP", fmt.Sprintf("offered load %.2f", o.Load)
	switch {
	case o.Engine != "" && o.EngineClients > 0:
		mode, load = o.Engine+" processes in wall time", fmt.Sprintf("%d closed-loop clients", o.EngineClients)
	case o.Engine != "":
		mode, load = o.Engine+" processes in wall time", fmt.Sprintf("offered load %.2f of the engines' capacity (load factor %.2g)", o.Load, o.EngineLoadFactor)
	case o.SideBySide:
		mode, load = "virtual time, real HTTP, prefill side by side", fmt.Sprintf("offered load %.2f of the engines' capacity (load factor %.2g)", o.Load, o.EngineLoadFactor)
	case o.EngineLoadFactor > 1:
		load = fmt.Sprintf("offered load %.2f, decode load factor %.2g", o.Load, o.EngineLoadFactor)
	}
	seqs := "told to the routers"
	if !o.SlotsConfigured {
		seqs = "not told to the routers"
	}
	fmt.Fprintf(w, "router benchmark (%s): %d backends, %s, %d requests/workload, KV %d blocks x %d tokens, %d seqs (%s), prefill %s/token, decode %s/token, router c=%.2f share=%.2f slack=%.2f hot=%.2f, %d router replica(s)\n",
		mode, o.Backends, load, o.Requests, o.KVBlocks, o.BlockTokens, o.MaxSeqs, seqs, o.PrefillPerToken, o.DecodePerToken, o.LoadFactor, o.ShareFactor, o.Slack, o.HotShare, max(o.Replicas, 1))
	if len(o.Speeds) > 0 {
		told := "not told to the routers"
		if o.SpeedsConfigured {
			told = "the routers' backend config gives them"
		}
		fmt.Fprintf(w, "backend speeds %v (relative to those times; %s; busiest figures are over each backend's fair share, its speed over the mean)\n", o.Speeds, told)
	}
	fmt.Fprintf(w, "machine: %d CPUs, load average %.2f at start, %.2f at end, %s\n\n", r.Machine.CPUs, r.Machine.LoadAvg1, r.Machine.LoadAvg1E, r.Machine.GoVersion)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tstrategy\tKV hit\tof best\tTTFT p50 s\tp90 s\tp95 s\tp99 s\topen rps\tsat rps\tbusiest/mean\tprefill busiest/mean\t429\t503\terrors\t")
	for _, wr := range r.Workloads {
		for _, s := range wr.Strategies {
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.2f\t%.3f\t%.3f\t%.3f\t%.3f\t%.2f\t%.2f\t%.3f\t%.3f\t%d\t%d\t%d\t\n", wr.Name, s.Strategy, s.HitRate, ratio(s.HitRate, wr.BestReuse),
				s.TTFTp50, s.TTFTp90, s.TTFTp95, s.TTFTp99, s.OpenThroughput, s.Throughput, s.BusiestShare, s.BusiestWork, s.Rejected429, s.Rejected503, s.Errors)
		}
		fmt.Fprintf(tw, "%s\tbest possible\t%.3f\t\t(fleet-size LRU: %.3f)\t\t\t\t\t\t\t\t\t\t\t\n", wr.Name, wr.BestReuse, wr.BestReuseFleet)
		if wr.EngineCapacity > 0 {
			fmt.Fprintf(tw, "%s\tengine capacity\t%.1f rps\t\t(offered %.1f rps)\t\t\t\t\t\t\t\t\t\t\t\n", wr.Name, wr.EngineCapacity, wr.EngineRate)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nprefix-aware against the goals:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\thit/best (>=0.90)\thit/fleet-LRU best\tTTFT p50 vs random (<=0.25)\tvs least (<=0.5; <=1.05 noshare)\tbusiest (<=1.08)\tsat rps vs random (>=1.16)\t")
	for _, wr := range r.Workloads {
		p, rnd, lo := wr.get(balance.PrefixAware), wr.get(balance.Random), wr.get(balance.LeastOutstanding)
		if p == nil || rnd == nil || lo == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.3f\t%.2f\t\n", wr.Name, ratio(p.HitRate, wr.BestReuse), ratio(p.HitRate, wr.BestReuseFleet), ratio(p.TTFTp50, rnd.TTFTp50),
			ratio(p.TTFTp50, lo.TTFTp50), p.BusiestShare, ratio(p.Throughput, rnd.Throughput))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeDefaultsVsBest(w, r); err != nil {
		return err
	}
	if err := writeScaleOut(w, r.ScaleOut); err != nil {
		return err
	}
	if d := r.Decision; d != nil {
		fmt.Fprintf(w, "\ndecision time (scan+hash+decide+index), %d backends, %d-byte bodies, %d samples: p50 %.1f us, p99 %.1f us (goal p99 <= 25 us)\n",
			d.Backends, d.PromptBytes, d.Samples, d.P50us, d.P99us)
		fmt.Fprintf(w, "  this machine's floor: a fixed computation of that p50, as many samples: p50 %.1f us, p99 %.1f us\n", d.Floor.P50us, d.Floor.P99us)
		for _, s := range d.ByStrategy {
			fmt.Fprintf(w, "  %-17s p50 %.1f us p99 %.1f us\n", s.Strategy, s.P50us, s.P99us)
		}
	}
	if ov := r.Overhead; ov != nil {
		fmt.Fprintf(w, "added latency at %d req/s, %d-byte bodies, %d requests per mode: direct p50 %.3f ms p99 %.3f ms; via router p50 %.3f ms p99 %.3f ms; added p50 %.3f ms p99 %.3f ms (goal p99 <= 0.3 ms); failures %d\n",
			ov.Rate, ov.PromptBytes, ov.Requests, ov.DirectP50ms, ov.DirectP99ms, ov.RouterP50ms, ov.RouterP99ms, ov.AddedP50ms, ov.AddedP99ms, ov.Failures)
		fmt.Fprintf(w, "  a bare proxy (net/http/httputil, round robin, the router's transport, nothing read): p50 %.3f ms p99 %.3f ms; added p50 %.3f ms p99 %.3f ms: one more HTTP hop here\n",
			ov.HopP50ms, ov.HopP99ms, ov.HopAddedP50ms, ov.HopAddedP99ms)
		for _, so := range ov.ByStrategy {
			fmt.Fprintf(w, "  %-17s via router p50 %.3f ms p99 %.3f ms; added p50 %.3f ms p99 %.3f ms; over the bare proxy p50 %.3f ms p99 %.3f ms; failures %d\n",
				so.Strategy, so.RouterP50ms, so.RouterP99ms, so.AddedP50ms, so.AddedP99ms, so.OverHopP50ms, so.OverHopP99ms, so.Failures)
		}
		fmt.Fprintf(w, "  paired (%s, each request sent through the router and, at once, directly / through the bare proxy, %d pairs each): added p50 %.3f / %.3f ms, p99 %.3f / %.3f ms\n",
			balance.PrefixAware, ov.PairedRequests, ov.PairedAddedP50ms, ov.PairedOverHopP50ms, ov.PairedAddedP99ms, ov.PairedOverHopP99ms)
	}
	return nil
}

// writeDefaultsVsBest sets the default strategy against the best other
// strategy of the same run, per workload: TTFT p50, p90 and p99 (lower is
// better; the goal is a ratio <= 1), each with its 90% interval
// over resampled requests (DefaultVsBest), and saturated throughput.
func writeDefaultsVsBest(w io.Writer, r *Results) error {
	def := router.Defaults().Strategy
	fmt.Fprintf(w, "\n%s (the default) against the best other strategy in this run (goal: TTFT ratios <= 1, sat ratio >= 1, busiest <= 1.25;\n"+
		"[low-high]: 90%% of the ratio over %d resamples of the requests, the same ones for both strategies):\n", def, bootstrapRounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tTTFT p50 ratio\tbest p50 by\tp90 ratio\tbest p90 by\tp99 ratio\tbest p99 by\tsat rps ratio\tbest sat by\tbusiest\t")
	for _, wr := range r.Workloads {
		p, vs := wr.get(def), wr.VsBest
		if p == nil || vs == nil {
			continue
		}
		var sat *StrategyResult
		for i := range wr.Strategies {
			if s := &wr.Strategies[i]; s.Strategy != def && (sat == nil || s.Throughput > sat.Throughput) {
				sat = s
			}
		}
		satRatio, satBy := "-", "(not run)"
		if sat.Throughput > 0 {
			satRatio, satBy = fmt.Sprintf("%.2f", ratio(p.Throughput, sat.Throughput)), string(sat.Strategy)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t\n", wr.Name, vs.P50, vs.P50.By, vs.P90, vs.P90.By, vs.P99, vs.P99.By,
			satRatio, satBy, p.BusiestShare)
	}
	return tw.Flush()
}

// writeScaleOut prints the scale-out phase, one row per strategy and window.
func writeScaleOut(w io.Writer, so *ScaleOutResult) error {
	if so == nil {
		return nil
	}
	fmt.Fprintf(w, "\nscale-out: %s on %d backends, %d more (not holding the weights warm) join before request %d; per window of arrivals:\n",
		so.Workload, so.Backends, so.Added, so.AddedAt)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\trequests\tKV hit\tTTFT p50 s\tp95 s\tp99 s\tto added\tfailed\t")
	for _, s := range so.Strategies {
		for _, win := range s.Windows {
			mark := ""
			if win.From <= so.AddedAt && so.AddedAt < win.To {
				mark = "+"
			}
			fmt.Fprintf(tw, "%s\t%s%d-%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.2f\t%d\t\n", s.Strategy, mark, win.From, win.To-1,
				win.HitRate, win.TTFTp50, win.TTFTp95, win.TTFTp99, win.NewShare, win.Failed)
		}
	}
	return tw.Flush()
}
