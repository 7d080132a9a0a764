package lab

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/bench"
)

func runBenchRouter(ctx context.Context, e *cli.Env, args []string) error {
	cli.TuneRouterGC() // the bench runs the router in this process: same GC as the command
	fs := cli.NewFlagSet(e, "bench router")
	o := bench.DefaultOptions()
	fs.IntVar(&o.Backends, "backends", o.Backends, "simulated backends")
	speeds := fs.String("backend-speeds", "", "comma-separated speed of each backend relative to the simulator's times, e.g. 2,2,2,2,1,1,1,1 for a fleet of two GPU generations (empty: all 1)")
	fs.BoolVar(&o.SpeedsConfigured, "router-speeds", o.SpeedsConfigured, "tell the routers each backend's --backend-speeds speed, as the backends' speed config key would")
	fs.BoolVar(&o.SlotsConfigured, "router-slots", o.SlotsConfigured, "tell the routers the engines' sequence slots (--max-seqs), as the max_num_seqs config key would")
	fs.Float64Var(&o.Load, "load", o.Load, "offered load: uncached prefill work / fleet prefill capacity (with --engine llm-d-inference-sim: sequence slot time / the fleet's slots)")
	fs.IntVar(&o.Requests, "requests", o.Requests, "requests per workload")
	workloads := fs.String("workloads", strings.Join(o.Workloads, ","), "comma-separated: "+strings.Join(bench.AllWorkloads(), ", "))
	var names []string
	for _, s := range o.Strategies {
		names = append(names, string(s))
	}
	strategies := fs.String("strategies", strings.Join(names, ","), "comma-separated strategies to compare, side by side in one run")
	fs.StringVar(&o.TracesDir, "traces-dir", o.TracesDir, "directory holding the Mooncake traces (.jsonl or .jsonl.gz); empty uses the copies built into the binary")
	fs.IntVar(&o.TraceOffset, "trace-offset", o.TraceOffset, "first trace row to replay")
	simFlags(fs, &o.Sim)
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "workload seed")
	fs.BoolVar(&o.Saturation, "saturation", o.Saturation, "also measure saturated throughput with a closed loop of --closed-clients per backend, over at least 4 rounds of them, counted between the first round and the last")
	fs.IntVar(&o.ClosedPerBE, "closed-clients", o.ClosedPerBE, "closed-loop clients per backend (0: --max-seqs, every sequence slot)")
	fs.Float64Var(&o.LoadFactor, "load-factor", o.LoadFactor, "router load factor c (0: the router's default)")
	fs.Float64Var(&o.Slack, "slack", o.Slack, "router slack (0: the router's default)")
	fs.Float64Var(&o.DecodeWeight, "decode-weight", o.DecodeWeight, "router decode weight in the load bound (0: the router's default)")
	fs.Float64Var(&o.ShareFactor, "share-factor", o.ShareFactor, "router traffic share factor (0: the router's default)")
	fs.Float64Var(&o.BalanceSlack, "balance-slack", o.BalanceSlack, "router balance slack (0: the router's default)")
	fs.IntVar(&o.ShareHalfLife, "share-half-life", o.ShareHalfLife, "router traffic share half-life in decisions (0: the router's default)")
	fs.Float64Var(&o.HotShare, "hot-share", o.HotShare, "router hot-prefix share (0: the router's default, off)")
	fs.IntVar(&o.Replicas, "replicas", o.Replicas, "router replicas sharing the workload traffic, each with its own state (request i goes to replica i mod N)")
	fs.BoolVar(&o.ReplicaSync, "replica-sync", o.ReplicaSync, "replicas observe each other's requests at once: placements, traffic shares and load (what --peer-listen streams between real replicas)")
	fs.BoolVar(&o.KVEvents, "kv-events", o.KVEvents, "every simulator publishes its KV-cache events (ZMQ, vLLM's format) and the routers follow them")
	fs.BoolVar(&o.TokenPrompts, "token-prompts", o.TokenPrompts, "send every prompt as token ids (completions), whose engine block hashes the router can compute")
	engine := fs.String("engine", "llmsim", "backends: llmsim (simulated in virtual time) or llm-d-inference-sim (processes from bin/ or PATH, in wall time)")
	fs.IntVar(&o.EngineClients, "engine-clients", o.EngineClients, "with --engine llm-d-inference-sim: closed-loop clients instead of arrivals at --load x the engines' capacity (0: open loop)")
	fs.Float64Var(&o.EngineLoadFactor, "engine-load-factor", o.EngineLoadFactor, "how many times slower the engines' prefill and decode are with every sequence slot (--max-seqs) busy than with one: llm-d-inference-sim's --time-factor-under-load; llmsim's decode, and its prefill with --side-by-side-prefill")
	fs.IntVar(&o.OverheadRate, "overhead-rate", o.OverheadRate, "requests/s for the overhead phase (0: skip)")
	fs.DurationVar(&o.OverheadDuration, "overhead-duration", o.OverheadDuration, "length of each overhead round")
	fs.IntVar(&o.OverheadRounds, "overhead-rounds", o.OverheadRounds, "overhead rounds per mode")
	fs.IntVar(&o.DecisionBackends, "decision-backends", o.DecisionBackends, "backends for the decision-time phase (0: skip)")
	fs.IntVar(&o.DecisionPrompt, "prompt-bytes", o.DecisionPrompt, "prompt size for the decision-time and overhead phases")
	fs.StringVar(&o.ScaleOut, "scale-out", o.ScaleOut, "workload of the scale-out phase, which adds backends when half its requests have arrived (empty: skip)")
	fs.IntVar(&o.ScaleOutAdd, "scale-out-add", o.ScaleOutAdd, "backends the scale-out phase adds")
	output := fs.String("o", "text", "output format: text or json")
	plot := fs.String("plot", "", "also write a TTFT CDF plot to this SVG file")
	requestsOut := fs.String("requests-out", "", "also write every open-loop request of every strategy to this file, a JSON line each: arrival, prompt and answer tokens, backend, the router's reason and match, TTFT")
	if err := cli.ParseFlags(fs, e, args); err != nil {
		return err
	}
	if err := checkOutput("plot", *plot, true); err != nil {
		return err
	}
	if err := checkOutput("requests-out", *requestsOut, false); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError("unexpected arguments %q", fs.Args())
	}
	if *output != "text" && *output != "json" {
		return cli.UsageError("-o must be text or json")
	}
	o.Workloads = nil
	known := map[string]bool{}
	for _, w := range bench.AllWorkloads() {
		known[w] = true
	}
	for _, w := range strings.Split(*workloads, ",") {
		if w = strings.TrimSpace(w); w == "" {
			continue
		}
		if !known[w] {
			return cli.UsageError("unknown workload %q (want %s)", w, strings.Join(bench.AllWorkloads(), ", "))
		}
		o.Workloads = append(o.Workloads, w)
	}
	o.Strategies = nil
	for _, s := range strings.Split(*strategies, ",") {
		st, err := balance.ParseStrategy(strings.TrimSpace(s))
		if err != nil {
			return cli.UsageError("%v", err)
		}
		o.Strategies = append(o.Strategies, st)
	}
	for _, f := range strings.Split(*speeds, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return cli.UsageError("--backend-speeds: %q is not a number", f)
		}
		o.Speeds = append(o.Speeds, v)
	}
	if *engine != "llmsim" {
		o.Engine = *engine
	}
	if err := o.Validate(); err != nil {
		return cli.UsageError("%v", err)
	}
	o.Progress = e.Stderr
	// The records are flushed whether or not the run completes: what was
	// measured before a failure is kept.
	closeRecords := func() error { return nil }
	if *requestsOut != "" {
		f, err := os.Create(*requestsOut)
		if err != nil {
			return fmt.Errorf("requests-out: %w", err)
		}
		defer f.Close() // after closeRecords: a second Close, harmless
		buf := bufio.NewWriter(f)
		o.RequestsOut = buf
		closeRecords = func() error {
			if err := buf.Flush(); err != nil {
				return fmt.Errorf("requests-out: %w", err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("requests-out: %w", err)
			}
			return nil
		}
	}
	res, err := bench.Run(ctx, o)
	if cerr := closeRecords(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	write := bench.WriteText
	if *output == "json" {
		write = bench.WriteJSON
	}
	// The report first: a plot that cannot be written must not cost it.
	if err := write(e.Stdout, res); err != nil {
		return err
	}
	if *plot != "" {
		return writePlot(*plot, res)
	}
	return nil
}

// writePlot writes the TTFT CDF SVG, replacing the file only when complete.
func writePlot(path string, res *bench.Results) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if err := bench.WriteSVG(f, res); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("plot: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("plot: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}
