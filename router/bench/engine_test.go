package bench

import (
	"bytes"
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/oai"
)

// TestEngineWorkloadOffersAFractionOfCapacity: with llm-d-inference-sim,
// --load is a fraction of the engines' capacity (sequence slots over the
// time a request holds one, at the full-load factor), as it is of the
// prefill capacity in virtual time; before, the engine mode ignored it and
// ran a fixed number of closed-loop clients.
func TestEngineWorkloadOffersAFractionOfCapacity(t *testing.T) {
	o := DefaultOptions()
	o.Engine, o.Backends, o.Load, o.EngineLoadFactor = EngineInferenceSim, 2, 0.5, 2
	o.Sim.MaxSeqs, o.Sim.PrefillPerToken, o.Sim.DecodePerToken = 3, time.Millisecond, 10*time.Millisecond
	w := Workload{Name: "t"}
	for i := range 4 {
		// 4 tokens to the simulator's tokenizer: "hello ", "world", ", ", "again".
		w.Requests = append(w.Requests, Request{At: time.Duration(i) * time.Second, Path: "/v1/completions",
			Body: completionBody("sim", "hello world, again", 11), PromptTokens: 5, OutTokens: 11})
	}
	// A slot is held 4 x 1 ms + 10 x 10 ms, twice as long at full load.
	want := 2 * 3 / (2 * 0.104)
	capacity, err := engineWorkload(&o, &w)
	if err != nil || math.Abs(capacity-want) > 1e-9 {
		t.Fatalf("capacity %v, %v; want %v", capacity, err, want)
	}
	// 4 requests at half of it: the trace's timing scaled to that rate.
	if got, wantLast := w.Requests[3].At.Seconds(), 4/(0.5*want); math.Abs(got-wantLast) > 1e-6 {
		t.Errorf("last arrival at %vs, want %vs", got, wantLast)
	}
	for _, r := range w.Requests {
		req, err := oai.Scan(r.Body)
		if err != nil || string(req.Prompt) != "hello world, again" || req.MaxTokens != 11 || !bytes.Contains(r.Body, []byte(`"ignore_eos":true}`)) {
			t.Fatalf("body %s: %+v, %v", r.Body, req, err)
		}
	}
	o.Sim.PrefillPerToken, o.Sim.DecodePerToken = 0, 0
	if _, err := engineCapacity(&o, &w); err == nil {
		t.Error("no latency model: want an error, not an infinite capacity")
	}
}

// TestOpenWallDoesNotWaitForAnswers: the open loop sends every request at
// its arrival time while the answers before it are still pending (a closed
// loop would hold the next request until one ended).
func TestOpenWallDoesNotWaitForAnswers(t *testing.T) {
	var arrived atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		<-release
		_, _ = w.Write([]byte("data: ok\n\n"))
	}))
	defer srv.Close()
	reqs := make([]Request, 5)
	for i := range reqs {
		reqs[i] = Request{At: time.Duration(i) * time.Millisecond, Path: "/v1/completions", Body: []byte(`{}`)}
	}
	done := make(chan []outcome)
	var lags []float64
	go func() {
		outs, l := openWall(context.Background(), srv.Client(), srv.URL, reqs)
		lags = l
		done <- outs
	}()
	wait.For(t, "every request sent before any answer", func() bool { return arrived.Load() == int32(len(reqs)) })
	close(release)
	outs := <-done
	for i, out := range outs {
		if out.err != nil || out.status != http.StatusOK || out.ttft <= 0 {
			t.Errorf("request %d: %+v", i, out)
		}
	}
	if len(lags) != len(reqs) {
		t.Errorf("%d lags for %d requests", len(lags), len(reqs))
	}
}

// TestRunEngine replays a workload through the router to real
// llm-d-inference-sim processes at an offered load: every request answered
// with as many tokens as it asked for (an echo is the prompt's length,
// whatever max_tokens says), each backend's share reported.
func TestRunEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts llm-d-inference-sim processes")
	}
	if _, err := testenv.InferenceSimPath(); err != nil {
		t.Skip(err)
	}
	o := DefaultOptions()
	o.Engine, o.Backends, o.Requests, o.Load = EngineInferenceSim, 2, 24, 0.5
	o.Sim.MaxSeqs, o.Sim.PrefillPerToken, o.Sim.DecodePerToken, o.Sim.KVBlocks = 2, 10*time.Microsecond, time.Millisecond, 1024
	o.Workloads, o.Strategies = []string{WorkNoShare}, []balance.Strategy{balance.PrefixAware}
	o.Saturation, o.OverheadRate, o.DecisionBackends, o.ScaleOut = false, 0, 0, ""
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	wr := res.Workloads[0]
	s := wr.Strategies[0]
	want := 0
	for range wr.Requests {
		want += 100 // noshare's max_tokens
	}
	got, requests := 0.0, 0.0
	for _, b := range s.ByBackend {
		got += b.OutputTokens
		requests += b.Requests
	}
	if s.Errors+s.Rejected429+s.Rejected503 != 0 || s.TTFTp50 <= 0 || requests != float64(wr.Requests) || int(got) != want ||
		wr.EngineCapacity <= 0 || math.Abs(wr.EngineRate-o.Load*wr.EngineCapacity) > 1e-9 || s.EngineCPU <= 0 || s.BenchCPU <= 0 {
		t.Fatalf("%+v\nworkload %+v\noutput tokens %v, want %d", s, wr, got, want)
	}
}
