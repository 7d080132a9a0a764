package bench

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/llmsim"
)

// ScaleOutResult is the scale-out phase: one workload replayed per
// strategy on Backends backends, with ScaleOutAdd more joining when half
// the requests have arrived; the figures are per window of arrivals.
type ScaleOutResult struct {
	Workload   string             `json:"workload"`
	Backends   int                `json:"backends_before"`
	Added      int                `json:"backends_added"`
	AddedAt    int                `json:"added_before_request"`
	Strategies []ScaleOutStrategy `json:"strategies"`
}

// ScaleOutStrategy is one strategy's windows.
type ScaleOutStrategy struct {
	Strategy balance.Strategy `json:"strategy"`
	Windows  []ScaleWindow    `json:"windows"`
}

// ScaleWindow is the requests that arrived in [From, To) (by arrival
// order), from the arrival of From to that of To. HitRate is the prompt
// tokens the engines served from cache over all they admitted in that
// time (their prefix-cache counters); the TTFTs are those requests'
// own; NewShare the fraction of them routed to a backend added mid-run
// (whose node does not hold the weights warm).
type ScaleWindow struct {
	From     int     `json:"from"`
	To       int     `json:"to"`
	HitRate  float64 `json:"kv_hit_rate"`
	TTFTp50  float64 `json:"ttft_p50_s"`
	TTFTp95  float64 `json:"ttft_p95_s"`
	TTFTp99  float64 `json:"ttft_p99_s"`
	NewShare float64 `json:"share_to_added"`
	Failed   int     `json:"failed"`
}

// scaleOutWindows is how many windows the phase reports.
const scaleOutWindows = 8

// measureScaleOut runs the scale-out phase for every strategy.
func measureScaleOut(ctx context.Context, o *Options, w *Workload) (*ScaleOutResult, error) {
	res := &ScaleOutResult{Workload: w.Name, Backends: o.Backends, Added: o.ScaleOutAdd, AddedAt: len(w.Requests) / 2}
	for _, st := range o.Strategies {
		sr, err := scaleOutStrategy(ctx, o, w, st, res.AddedAt)
		if err != nil {
			return nil, fmt.Errorf("scale-out %s: %w", st, err)
		}
		res.Strategies = append(res.Strategies, sr)
	}
	return res, nil
}

func scaleOutStrategy(ctx context.Context, o *Options, w *Workload, st balance.Strategy, at int) (ScaleOutStrategy, error) {
	sr := ScaleOutStrategy{Strategy: st}
	client := newClient()
	defer client.CloseIdleConnections()
	clock := llmsim.NewVirtualClock(time.Unix(0, 0))
	all := o.Backends + o.ScaleOutAdd
	f, err := startFleet(ctx, o, all, virtualSim(o.Sim, clock), st)
	if err != nil {
		return sr, err
	}
	defer f.stop()
	eps := make([][]router.Endpoint, len(f.routers))
	for i, r := range f.routers {
		eps[i], _ = r.src.Endpoints()
		for j := o.Backends; j < all; j++ {
			eps[i][j].HoldsWeights = false // a new node, weights still arriving
		}
	}
	setFleet := func(n int) error {
		for i, r := range f.routers {
			r.src.Set(eps[i][:n])
		}
		for _, r := range f.routers { // the router follows its source on its own goroutine
			deadline := time.Now().Add(30 * time.Second)
			for len(r.rt.Snapshot().Backends) != n {
				if time.Now().After(deadline) {
					return fmt.Errorf("router did not take up %d backends", n)
				}
				time.Sleep(time.Millisecond)
			}
			r.rt.ProbeOnce(ctx) // the new backends' KV sizes
		}
		return nil
	}
	if err := setFleet(o.Backends); err != nil {
		return sr, err
	}
	added := map[string]bool{}
	for _, u := range f.simURLs[o.Backends:] {
		added[u] = true
	}
	n := len(w.Requests)
	// The engines' counters at each window's first arrival (taken at
	// quiet, so nothing is half counted) and at the end.
	var counts [][2]float64
	count := func() error {
		st, err := scrape(ctx, client, f.simURLs)
		if err != nil {
			return err
		}
		var c [2]float64
		for i := range st.hits {
			c[0], c[1] = c[0]+st.hits[i], c[1]+st.queries[i]
		}
		counts = append(counts, c)
		return nil
	}
	v := newDriver(clock, client, f)
	v.debug = true
	v.arrival = func(i int) error {
		if i == at {
			if err := setFleet(all); err != nil {
				return err
			}
		}
		if len(counts) < scaleOutWindows && i == len(counts)*n/scaleOutWindows {
			return count()
		}
		return nil
	}
	outs, _, err := v.openLoop(ctx, w.Requests)
	if err != nil {
		return sr, err
	}
	if err := count(); err != nil {
		return sr, err
	}
	for k := range scaleOutWindows {
		win := ScaleWindow{From: k * n / scaleOutWindows, To: (k + 1) * n / scaleOutWindows}
		var ttfts []float64
		toNew := 0
		for _, out := range outs[win.From:win.To] {
			if out.err != nil || out.status != http.StatusOK {
				win.Failed++
				continue
			}
			ttfts = append(ttfts, out.ttft.Seconds())
			if added[out.backend] {
				toNew++
			}
		}
		if k+1 < len(counts) {
			win.HitRate = ratio(counts[k+1][0]-counts[k][0], counts[k+1][1]-counts[k][1])
		}
		win.NewShare = ratio(float64(toNew), float64(len(ttfts)))
		win.TTFTp50, win.TTFTp95, win.TTFTp99 = quantile(ttfts, 0.5), quantile(ttfts, 0.95), quantile(ttfts, 0.99)
		sr.Windows = append(sr.Windows, win)
	}
	return sr, nil
}
