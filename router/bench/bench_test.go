package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/llmsim"
)

func TestParseTrace(t *testing.T) {
	tests := []struct {
		name, in string
		rows     int
		ok       bool
	}{
		{"good", `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}` + "\n\n" +
			`{"timestamp": 3, "input_length": 10, "output_length": 1, "hash_ids": [0]}`, 2, true},
		{"hash ids do not cover the input", `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0]}`, 0, false},
		{"negative length", `{"timestamp": 0, "input_length": -1, "output_length": 5, "hash_ids": []}`, 0, false},
		{"time goes back", `{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [0]}` + "\n" +
			`{"timestamp": 4, "input_length": 1, "output_length": 1, "hash_ids": [0]}`, 0, false},
		{"unknown field", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0], "x": 1}`, 0, false},
		{"not json", `timestamp=0`, 0, false},
		{"empty", ``, 0, false},
	}
	for _, tc := range tests {
		rows, err := ParseTrace(strings.NewReader(tc.in), 0)
		if (err == nil) != tc.ok || len(rows) != tc.rows {
			t.Errorf("%s: %d rows, err %v", tc.name, len(rows), err)
		}
	}
}

func FuzzParseTrace(f *testing.F) {
	f.Add(`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}`)
	f.Add(`{"timestamp": 1e3, "input_length": 1, "output_length": 1, "hash_ids": [18446744073709551615]}`)
	f.Fuzz(func(t *testing.T, in string) {
		rows, err := ParseTrace(strings.NewReader(in), 0)
		if err != nil {
			return
		}
		w := FromTrace("x", rows, "m", 4)
		for i, r := range w.Requests {
			if r.PromptTokens != rows[i].InputLength || r.At < 0 || !json.Valid(r.Body) {
				t.Fatalf("row %d expanded wrongly: %+v", i, r)
			}
		}
	})
}

func TestFromTraceSharesPrefixes(t *testing.T) {
	w, err := LoadTrace("testdata", WorkMoonConv, 0, 40, "m", 4)
	if err != nil {
		t.Fatal(err)
	}
	tok := llmsim.Tokenizer{CharsPerToken: 4, BlockTokens: 16}
	// Every request starts with hash id 0: 512 tokens, 32 blocks in common.
	if got := BestReuse(&w, tok, 0); got <= 0 || got >= 1 {
		t.Fatalf("best reuse %v", got)
	}
	a := tok.BlockHashes(bodyPrompt(t, w.Requests[0].Body), "")
	b := tok.BlockHashes(bodyPrompt(t, w.Requests[1].Body), "")
	shared := 0
	for shared < len(a) && shared < len(b) && a[shared] == b[shared] {
		shared++
	}
	if shared != 512/16 {
		t.Fatalf("first two requests share %d blocks, want %d", shared, 512/16)
	}
}

func bodyPrompt(t *testing.T, body []byte) []byte {
	var v struct{ Prompt string }
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	return []byte(v.Prompt)
}

func TestBestReuse(t *testing.T) {
	tok := llmsim.Tokenizer{CharsPerToken: 4, BlockTokens: 16}
	p := strings.Repeat("x", 64*10) // 160 tokens, 10 blocks
	w := Workload{Requests: []Request{{Body: completionBody("m", p, 1)}, {Body: completionBody("m", p, 1)}, {Body: completionBody("m", "y"+p, 1)}}}
	// Second request: 159 of 160 tokens (the last is always computed);
	// the third (161 tokens) shares nothing.
	if got, want := BestReuse(&w, tok, 0), 159.0/(160+160+161); got != want {
		t.Fatalf("unlimited reuse %v, want %v", got, want)
	}
	// A 5-block cache keeps the head of the prefix (tails are evicted first).
	if got, want := BestReuse(&w, tok, 5), 80.0/(160+160+161); got != want {
		t.Fatalf("5-block reuse %v, want %v", got, want)
	}
}

// TestRunSmall runs every phase at toy size: real HTTP, virtual time.
func TestRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 2 fleets per strategy")
	}
	o := DefaultOptions()
	// 8 clients: the saturation phase runs satRounds x 8 = 32 requests,
	// more than the open loop's 24.
	o.Backends, o.Requests, o.ClosedPerBE = 2, 24, 4
	o.Sim.KVBlocks = 16384 // holds the longest prompt of the test trace rows
	o.Workloads = []string{WorkRAG, WorkMoonConv}
	o.TracesDir = "testdata"
	o.OverheadRate, o.OverheadDuration, o.OverheadRounds = 200, 100*time.Millisecond, 1
	o.DecisionBackends, o.DecisionPrompt, o.DecisionSamples = 4, 2000, 50
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Workloads) != 2 || res.Decision == nil || res.Overhead == nil {
		t.Fatalf("missing phases: %+v", res)
	}
	if d := res.Decision; len(d.ByStrategy) != len(o.Strategies) {
		t.Fatalf("decision time of %d strategies, want %d", len(d.ByStrategy), len(o.Strategies))
	}
	if f := res.Decision.Floor; !(f.P50us > 0 && f.P99us >= f.P50us) {
		t.Fatalf("machine floor not measured: %+v", f)
	}
	// Scale-out: nothing reaches the added backends before they join,
	// every strategy sends some there after.
	if so := res.ScaleOut; so == nil || len(so.Strategies) != len(o.Strategies) || so.AddedAt != 12 {
		t.Fatalf("scale-out: %+v", so)
	}
	for _, s := range res.ScaleOut.Strategies {
		before, after := 0.0, 0.0
		for _, win := range s.Windows {
			if win.Failed != 0 || win.HitRate < 0 || win.HitRate > 1 || win.TTFTp50 <= 0 {
				t.Errorf("scale-out %s window %+v", s.Strategy, win)
			}
			if win.To <= res.ScaleOut.AddedAt {
				before += win.NewShare
			} else {
				after += win.NewShare
			}
		}
		if before != 0 || after == 0 {
			t.Errorf("scale-out %s: share to the added backends %v before, %v after", s.Strategy, before, after)
		}
	}
	if ov := res.Overhead; len(ov.ByStrategy) != len(o.Strategies) || ov.Failures != 0 {
		t.Fatalf("overhead: %+v", ov)
	}
	// Paired rounds: one pair per request of a round (20 at 200/s for
	// 100 ms), each copy answered.
	if ov := res.Overhead; ov.PairedRequests != o.OverheadRounds*20 || ov.PairedAddedP99ms < ov.PairedAddedP50ms {
		t.Errorf("paired overhead: %d pairs, added p50 %v ms p99 %v ms", ov.PairedRequests, ov.PairedAddedP50ms, ov.PairedAddedP99ms)
	}
	// The bare proxy is a mode of every round: its latency is measured and
	// each strategy's excess over it is the difference of the quantiles.
	if ov := res.Overhead; ov.HopP50ms <= 0 || ov.HopP99ms < ov.HopP50ms || ov.HopAddedP99ms != ov.HopP99ms-ov.DirectP99ms ||
		ov.PairedOverHopP99ms < ov.PairedOverHopP50ms {
		t.Errorf("bare proxy overhead: %+v", ov)
	}
	for _, so := range res.Overhead.ByStrategy {
		if so.OverHopP99ms != so.RouterP99ms-res.Overhead.HopP99ms {
			t.Errorf("overhead of %s over the bare proxy: %+v", so.Strategy, so)
		}
		if so.RouterP50ms <= 0 || (so.Strategy == balance.PrefixAware && so.AddedP99ms != res.Overhead.AddedP99ms) {
			t.Errorf("overhead of %s: %+v", so.Strategy, so)
		}
	}
	for _, wr := range res.Workloads {
		if wr.Requests != 24 || wr.SatRequests != satRounds*8 {
			t.Errorf("%s: %d requests open loop, %d saturated, want 24 and %d", wr.Name, wr.Requests, wr.SatRequests, satRounds*8)
		}
		for _, s := range wr.Strategies {
			if s.Errors+s.Rejected429+s.Rejected503 != 0 || s.HitRate < 0 || s.HitRate > wr.BestReuse+1e-9 || s.TTFTp50 <= 0 || s.Throughput <= 0 {
				t.Errorf("%s/%s: %+v (best %v)", wr.Name, s.Strategy, s, wr.BestReuse)
			}
		}
		if p := wr.get(balance.PrefixAware); p.Reasons["hit"] == 0 && wr.Name != WorkMoonConv {
			t.Errorf("%s: prefix-aware never hit: %v", wr.Name, p.Reasons)
		}
		if vs := wr.VsBest; vs == nil || vs.P99.By == balance.PrefixAware || vs.P99.Ratio <= 0 || vs.P99.Low <= 0 || vs.P99.Low > vs.P99.High {
			t.Errorf("%s: the default against the best other: %+v", wr.Name, vs)
		}
	}
	var sb strings.Builder
	if err := WriteText(&sb, res); err != nil || !strings.Contains(sb.String(), "prefix-aware") || !strings.Contains(sb.String(), "scale-out: rag") {
		t.Fatalf("report: %v\n%s", err, sb.String())
	}
	sb.Reset()
	if err := WriteJSON(&sb, res); err != nil || !json.Valid([]byte(sb.String())) {
		t.Fatalf("json report: %v", err)
	}
}

// TestRunIsReproducible: the replay runs in virtual time and decides in
// trace order, so one seed gives the same figures however loaded the
// machine: requests landing at the same instant, a release racing the next
// arrival or the backends' ephemeral ports must not change a decision. With
// several router replicas too, each taking its turn of the requests.
func TestRunIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 2 fleets per strategy, twice")
	}
	for _, replicas := range []int{1, 3} {
		o := DefaultOptions()
		o.Backends, o.Requests, o.ClosedPerBE, o.Replicas = 4, 120, 4, replicas
		o.Workloads = []string{WorkMultiTurn}
		o.OverheadRate, o.DecisionBackends, o.ScaleOut = 0, 0, ""
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var runs [2][]StrategyResult
		var vs [2]DefaultVsBest
		for i := range runs {
			res, err := Run(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			runs[i], vs[i] = res.Workloads[0].Strategies, *res.Workloads[0].VsBest
		}
		if vs[0] != vs[1] {
			t.Errorf("%d replicas: the default against the best other differs between runs:\n%+v\n%+v", replicas, vs[0], vs[1])
		}
		for i, a := range runs[0] {
			b := runs[1][i]
			if a.HitRate != b.HitRate || a.SatHitRate != b.SatHitRate || a.Throughput != b.Throughput ||
				!slices.Equal(a.TTFTs, b.TTFTs) || !maps.Equal(a.Reasons, b.Reasons) || !slices.Equal(a.ByReplica, b.ByReplica) {
				t.Errorf("%d replicas: %s differs between runs:\n%+v\n%+v", replicas, a.Strategy, a, b)
			}
			// Request i goes to replica i mod 3: 40 decisions each.
			if want := slices.Repeat([]float64{40}, replicas); replicas > 1 && !slices.Equal(a.ByReplica, want) {
				t.Errorf("%d replicas: %s decisions by replica %v, want %v", replicas, a.Strategy, a.ByReplica, want)
			}
		}
	}
}

func TestSteadyRate(t *testing.T) {
	s, ms := time.Second, time.Millisecond
	for _, tc := range []struct {
		name    string
		ends    []time.Duration
		clients int
		want    float64
	}{
		{"too few", []time.Duration{s, 2 * s, 3 * s}, 1, 0},
		{"nothing between the rounds", []time.Duration{s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s}, 3, 0},
		{"even", []time.Duration{1 * s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s, 8 * s}, 2, 1},
		// A burst at the start and a straggler at the end do not count.
		{"ramp and drain ignored", []time.Duration{0, 0, 0, 10 * s, 10500 * ms, 11 * s, 11500 * ms, 12 * s, 12500 * ms, 13 * s, 50 * s, 100 * s}, 3, 2},
		{"unsorted", []time.Duration{8 * s, 1 * s, 7 * s, 2 * s, 6 * s, 3 * s, 5 * s, 4 * s}, 2, 1},
		// Four clients, three rounds: the t=0 burst's four answers land
		// within 0.4 s, then the fleet sustains one a second, then it
		// drains. The middle half of the completions (the old measure,
		// 1.43/s here) took in the burst's last answer and the drain's
		// first two.
		{"burst of a round", []time.Duration{100 * ms, 200 * ms, 300 * ms, 400 * ms, 1400 * ms, 2400 * ms, 3400 * ms, 4400 * ms, 4500 * ms, 4600 * ms, 4700 * ms, 4800 * ms}, 4, 1},
	} {
		if got := steadyRate(tc.ends, tc.clients); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: steadyRate = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRunRefusesBadRouterOptions: router settings the router would refuse
// end the run with the router's own error, not a silent default.
func TestRunRefusesBadRouterOptions(t *testing.T) {
	for _, hot := range []float64{-1, 101, math.NaN()} {
		o := DefaultOptions()
		o.HotShare = hot
		if _, err := Run(t.Context(), o); err == nil || !strings.Contains(err.Error(), "hot_share") {
			t.Errorf("hot share %v: err %v, want a hot_share error", hot, err)
		}
	}
}

// TestRunRejectsBadOptions: options a flag can carry are checked before any
// phase starts; NaN passes a plain "<= 0" test.
func TestRunRejectsBadOptions(t *testing.T) {
	for name, mutate := range map[string]func(*Options){
		"no backends":                 func(o *Options) { o.Backends = 0 },
		"too many":                    func(o *Options) { o.Backends = 257 },
		"load 0":                      func(o *Options) { o.Load = 0 },
		"load NaN":                    func(o *Options) { o.Load = math.NaN() },
		"load +Inf":                   func(o *Options) { o.Load = math.Inf(1) },
		"no requests":                 func(o *Options) { o.Requests = 0 },
		"time scale NaN":              func(o *Options) { o.Sim.TimeScale = math.NaN() },
		"load factor NaN":             func(o *Options) { o.LoadFactor = math.NaN() },
		"share factor Inf":            func(o *Options) { o.ShareFactor = math.Inf(1) },
		"trace offset -1":             func(o *Options) { o.TraceOffset = -1 },
		"overhead -1s":                func(o *Options) { o.OverheadRate, o.OverheadDuration = 1000, -time.Second },
		"overhead 0 rounds":           func(o *Options) { o.OverheadRate, o.OverheadRounds = 1000, 0 },
		"overhead rate -1":            func(o *Options) { o.OverheadRate = -1 },
		"decision 0 bytes":            func(o *Options) { o.DecisionBackends, o.DecisionPrompt = 4, 0 },
		"decision 0 samples":          func(o *Options) { o.DecisionBackends, o.DecisionSamples = 4, 0 },
		"decision 300 backends":       func(o *Options) { o.DecisionBackends = 300 },
		"replicas -1":                 func(o *Options) { o.Replicas = -1 },
		"replicas 17":                 func(o *Options) { o.Replicas = 17 },
		"speeds for 2 of 8":           func(o *Options) { o.Speeds = []float64{1, 2} },
		"speed 0":                     func(o *Options) { o.Backends, o.Speeds = 2, []float64{1, 0} },
		"speed NaN":                   func(o *Options) { o.Backends, o.Speeds = 2, []float64{math.NaN(), 1} },
		"speed 1000":                  func(o *Options) { o.Backends, o.Speeds = 2, []float64{1, 1000} },
		"told, none given":            func(o *Options) { o.SpeedsConfigured = true },
		"engine load factor 0.5":      func(o *Options) { o.EngineLoadFactor = 0.5 },
		"engine load factor NaN":      func(o *Options) { o.EngineLoadFactor = math.NaN() },
		"side by side, inference-sim": func(o *Options) { o.Engine, o.Sim.BlockTokens, o.Sim.SideBySide = EngineInferenceSim, 16, true },
		"speeds, inference-sim": func(o *Options) {
			o.Backends, o.Speeds, o.Engine, o.Sim.BlockTokens = 2, []float64{1, 2}, EngineInferenceSim, 16
		},
	} {
		o := DefaultOptions()
		o.Workloads, o.DecisionBackends, o.OverheadRate = []string{WorkNoShare}, 0, 0
		mutate(&o)
		if _, err := Run(t.Context(), o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestEmbeddedTraces reads both Mooncake traces from the copies built into
// the binary and checks their row counts against the published files (the
// whole file parses, so a truncated or edited copy fails here). It parses
// rows only: building every prompt is the benchmark's work, and slow under
// -race.
func TestEmbeddedTraces(t *testing.T) {
	for file, want := range map[string]int{"mooncake_conversation_trace.jsonl": 12031, "mooncake_synthetic_trace.jsonl": 3993} {
		r, err := openTrace("", file)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := ParseTrace(r, 0)
		r.Close()
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(rows) != want {
			t.Errorf("%s: %d rows, want %d", file, len(rows), want)
		}
	}
	if _, err := LoadTrace("", WorkMoonConv, 0, 2, "m", 4); err != nil {
		t.Errorf("loading two requests of the embedded trace: %v", err)
	}
	if _, err := LoadTrace(t.TempDir(), WorkMoonConv, 0, 1, "m", 4); err == nil || !strings.Contains(err.Error(), "mooncake_conversation_trace.jsonl") {
		t.Errorf("a directory without the trace: err = %v, want one naming the file", err)
	}
}

// TestRunWithKVEvents: simulators publishing their KV events, followed by
// two router replicas, over token-id prompts: the routers score backends
// from the events (exact, never a fallback on these clean streams), the
// decisions repeat from run to run (each batch holds the virtual clock
// until both replicas applied it), and the hit rate is within the best.
func TestRunWithKVEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 2 fleets per strategy, twice")
	}
	o := DefaultOptions()
	o.Backends, o.Requests, o.Replicas, o.Saturation = 3, 80, 2, false
	o.Sim.KVBlocks = 1024 // small enough to evict
	o.Workloads = []string{WorkRAG}
	o.Strategies = []balance.Strategy{balance.KVAware}
	o.KVEvents, o.TokenPrompts = true, true
	o.OverheadRate, o.DecisionBackends = 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var runs [2]StrategyResult
	for i := range runs {
		res, err := Run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		wr := res.Workloads[0]
		s := wr.Strategies[0]
		if s.Errors != 0 || s.Reasons["kv/exact"] == 0 || s.Reasons["kv/approximate"] != 0 || s.HitRate <= 0 || s.HitRate > wr.BestReuse+1e-9 {
			t.Fatalf("run %d: %+v (best %v)", i, s, wr.BestReuse)
		}
		runs[i] = s
	}
	// The decisions and the simulators' hit counts repeat exactly: requests
	// one finish admits together prefill in admission order (llmsim's
	// TestAdmittedTogetherPrefillInOrder), not in the order their
	// goroutines wake, which made hit counts differ by a few tokens.
	if a, b := runs[0], runs[1]; a.HitRate != b.HitRate || !maps.Equal(a.Reasons, b.Reasons) || !slices.Equal(a.ByReplica, b.ByReplica) {
		t.Errorf("runs differ:\n%+v\n%+v", a, b)
	}
}

// TestBackendSpeeds: a fleet whose every backend is 4 times as fast, at the
// same offered load, replays the same run in a quarter of the time (load is
// offered against the fleet's capacity, and each simulator's times
// shrink); busiest shares are taken over each backend's speed.
func TestBackendSpeeds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 2 fleets")
	}
	o := DefaultOptions()
	o.Backends, o.Requests, o.Saturation = 2, 60, false
	o.Workloads, o.Strategies = []string{WorkNoShare}, []balance.Strategy{balance.Random}
	o.OverheadRate, o.DecisionBackends, o.ScaleOut = 0, 0, ""
	p50 := func(speeds []float64) float64 {
		o.Speeds = speeds
		res, err := Run(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		return res.Workloads[0].Strategies[0].TTFTp50
	}
	slow, fast := p50(nil), p50([]float64{4, 4})
	if r := fast / slow; r < 0.24 || r > 0.26 {
		t.Errorf("TTFT p50 %.4fs at speed 4, %.4fs at 1: ratio %.3f, want 0.25", fast, slow, r)
	}
	o.Speeds = []float64{3, 1}
	if got := o.fairBusiest([]float64{30, 10}); got != 1 {
		t.Errorf("busiest of 30 and 10 requests at speeds 3 and 1: %v, want 1 (each its fair share)", got)
	}
	if got := o.fairBusiest([]float64{20, 20}); got != 1.5 {
		t.Errorf("busiest of 20 and 20 requests at speeds 3 and 1: %v, want 1.5", got)
	}
}

// TestRequestsOut: every open-loop request of every strategy is written
// once, with the backend it went to, the router's reason and its TTFT as
// the run counted it.
func TestRequestsOut(t *testing.T) {
	o := DefaultOptions()
	o.Backends, o.Requests, o.Saturation = 3, 30, false
	o.Workloads, o.Strategies = []string{WorkSystem}, []balance.Strategy{balance.PrefixAware, balance.Random}
	o.OverheadRate, o.DecisionBackends, o.ScaleOut = 0, 0, ""
	var out bytes.Buffer
	o.RequestsOut = &out
	res, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[balance.Strategy][]RequestRecord{}
	dec := json.NewDecoder(&out)
	for dec.More() {
		var r RequestRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		seen[r.Strategy] = append(seen[r.Strategy], r)
	}
	for _, s := range res.Workloads[0].Strategies {
		recs := seen[s.Strategy]
		if len(recs) != len(s.ByRequest) || len(recs) != o.Requests {
			t.Fatalf("%s: %d records for %d requests", s.Strategy, len(recs), len(s.ByRequest))
		}
		for i, r := range recs {
			if r.Workload != WorkSystem || r.Request != i || r.Prompt <= 0 || r.MaxTok <= 0 || r.Backend < 0 || r.Backend >= o.Backends ||
				r.Reason == "" || !strings.Contains(r.Matched, "/") || r.Status != 200 || r.TTFT != s.ByRequest[i] {
				t.Fatalf("%s request %d: %+v (TTFT counted %v)", s.Strategy, i, r, s.ByRequest[i])
			}
		}
	}
}

// TestRunSideBySide: llmsim prefilling side by side under a load factor
// (llm-d-inference-sim's latency model, in virtual time) is scheduled by
// its slots, as those engines are, and says so in the results.
func TestRunSideBySide(t *testing.T) {
	o := DefaultOptions()
	o.Backends, o.Requests, o.Saturation = 2, 60, false
	o.Workloads, o.Strategies = []string{WorkNoShare}, []balance.Strategy{balance.LeastOutstanding}
	o.OverheadRate, o.DecisionBackends, o.ScaleOut = 0, 0, ""
	o.Sim.MaxSeqs, o.Sim.SideBySide, o.EngineLoadFactor = 4, true, 2
	var out bytes.Buffer
	o.RequestsOut = &out
	res, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	wr := res.Workloads[0]
	if !res.Options.SideBySide || res.Options.EngineLoadFactor != 2 {
		t.Errorf("options %+v: want side by side at load factor 2", res.Options)
	}
	w, err := o.replayed(WorkNoShare, o.Requests)
	if err != nil {
		t.Fatal(err)
	}
	capacity, err := slotCapacity(&o, &w, func(r *Request) (int, error) { return r.PromptTokens, nil })
	if err != nil || wr.EngineCapacity != capacity || math.Abs(wr.EngineRate-0.8*capacity) > 1e-9 {
		t.Errorf("capacity %v, offered %v; want %v (%v) and 0.8 of it", wr.EngineCapacity, wr.EngineRate, capacity, err)
	}
	if sr := wr.Strategies[0]; sr.Errors != 0 || len(sr.TTFTs) != o.Requests {
		t.Errorf("%d errors, %d TTFTs of %d requests", sr.Errors, len(sr.TTFTs), o.Requests)
	}
	// Arrivals come at that rate (Poisson: 60 gaps are within half of
	// their mean), not at the prefill stream's, several times faster.
	last := 0.0
	for line := range bytes.Lines(out.Bytes()) {
		var rec RequestRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatal(err)
		}
		last = max(last, rec.At)
	}
	if want := float64(o.Requests-1) / wr.EngineRate; last < want/2 || last > want*1.5 {
		t.Errorf("last arrival at %.2fs, want about %.2fs", last, want)
	}
}

// TestRouterLearnsPrefill: the default router learns from first bytes
// which kind of engine it routes to: llmsim prefilling side by side
// (llm-d-inference-sim's model) reads as overlapping, past
// balance.OverlapAt, and llmsim's default, one prefill stream as vLLM's
// scheduler, as a queue, below it (router/slotclock.go).
func TestRouterLearnsPrefill(t *testing.T) {
	for _, sideBySide := range []bool{true, false} {
		o := DefaultOptions()
		o.Requests, o.Saturation = 200, false
		o.Workloads, o.Strategies = []string{WorkMoonSynth}, []balance.Strategy{balance.PrefixAware}
		o.OverheadRate, o.DecisionBackends, o.ScaleOut = 0, 0, ""
		if sideBySide {
			o.Sim.MaxSeqs, o.Sim.SideBySide, o.EngineLoadFactor = 4, true, 2
		}
		res, err := Run(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		sr := res.Workloads[0].Strategies[0]
		if (sr.PrefillOverlap >= balance.OverlapAt) != sideBySide || sideBySide && !(sr.PrefillSlowdown > 0.2 && sr.PrefillSlowdown < 0.6) {
			t.Errorf("side by side %v: learned overlap %.3f (priced side by side from %v), slowdown %.3f (the engine's: 1/3)",
				sideBySide, sr.PrefillOverlap, balance.OverlapAt, sr.PrefillSlowdown)
		}
	}
}
