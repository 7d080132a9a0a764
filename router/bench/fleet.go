package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/llmsim"
	"github.com/warmfleet/warmfleet/router/prefix"
)

// maxReplicas bounds Options.Replicas: each replica is a router with its
// own index, and the phases run them all in this process.
const maxReplicas = 16

func (o *Options) replicas() int { return max(o.Replicas, 1) }

// fleet is N simulators and one or more routers over them, all listening
// on 127.0.0.1.
type fleet struct {
	sims    []*llmsim.Server
	simURLs []string
	routers []replica
	kv      []*kvFeed // the simulators' KV event feeds, with Options.KVEvents
	stop    func()
}

// replica is one router and where it listens.
type replica struct {
	rt  *router.Router
	url string
	reg *prometheus.Registry
	src *router.StaticSource // its backends (the scale-out phase changes them)
}

// reasons sums every replica's decisions by reason and, when there are
// several replicas, counts each one's decisions.
func (f *fleet) reasons() (map[string]float64, []float64) {
	out := map[string]float64{}
	var each []float64
	for _, r := range f.routers {
		n := 0.0
		for k, v := range reasons(r.reg) {
			out[k] += v
			// Overflows are counted under their reason too; kv scorings
			// are per backend, not decisions.
			if !strings.HasPrefix(k, overflowPrefix) && !strings.HasPrefix(k, kvPrefix) {
				n += v
			}
		}
		if len(f.routers) > 1 {
			each = append(each, n)
		}
	}
	for _, k := range f.kv {
		if n := k.late.Load(); n > 0 {
			out[kvPrefix+"late"] += float64(n)
		}
	}
	return out, each
}

func serve(h http.Handler) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String(), func() { _ = srv.Close() }, nil
}

func startFleet(ctx context.Context, o *Options, n int, sim llmsim.Config, st balance.Strategy) (*fleet, error) {
	var sims []*llmsim.Server
	var feeds []*kvFeed
	kctx, cancel := context.WithCancel(ctx)
	var now func() time.Time
	if sim.Clock != nil {
		// The routers time first bytes on the simulators' clock, as
		// self-tuning learns from them.
		now = sim.Clock.Now
	}
	f, err := startFleetWith(ctx, o, n, o.replicas(), st, now, func() (http.Handler, string, error) {
		c := sim
		if v := o.speed(len(sims)); v != 1 {
			c.PrefillPerToken = time.Duration(float64(c.PrefillPerToken) / v)
			c.DecodePerToken = time.Duration(float64(c.DecodePerToken) / v)
		}
		kvEvents := ""
		if o.KVEvents {
			k, err := newKVFeed(kctx, sim.Clock)
			if err != nil {
				return nil, "", err
			}
			feeds = append(feeds, k)
			c.Events, kvEvents = k, k.endpoint()
		}
		s, err := llmsim.New(c, prometheus.NewRegistry())
		if err == nil {
			sims = append(sims, s)
		}
		return s, kvEvents, err
	})
	if err != nil {
		cancel()
		return nil, err
	}
	f.sims, f.kv = sims, feeds
	for i, k := range feeds {
		k.url, k.f = f.simURLs[i], f
	}
	for _, k := range feeds {
		if err := k.handshake(ctx); err != nil {
			cancel()
			f.stop()
			return nil, err
		}
	}
	for _, k := range feeds {
		go k.run(kctx)
	}
	stop := f.stop
	f.stop = func() {
		cancel()
		for _, k := range feeds {
			k.pub.Wait()
			<-k.done
		}
		stop()
	}
	return f, nil
}

// startFleetWith starts n backends from newBackend and the given number of
// router replicas over them.
// newBackend also returns the backend's kv_events address ("" for none).
func startFleetWith(ctx context.Context, o *Options, n, replicas int, st balance.Strategy, now func() time.Time,
	newBackend func() (http.Handler, string, error)) (*fleet, error) {
	f := &fleet{}
	var stops []func()
	f.stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	cfg := o.routerConfig()
	cfg.Strategy = st
	// No router-side limit by default: simulators queue like vLLM does, and
	// the router queue waits in wall time, which a virtual clock cannot see.
	cfg.MaxInflight = o.RouterMaxInf
	cfg.CharsPerToken = float64(o.Sim.CharsPerToken)
	cfg.QueueTimeout = 60 * time.Second
	cfg.ProbeInterval = -1 // probed once below; later probes would only add noise
	cfg.RampUp = 0
	cfg.KVBlockSize, cfg.KVHashSeed = o.Sim.BlockTokens, o.Sim.HashSeed
	if now != nil {
		// Engine metrics are read on a wall-time ticker; on a virtual
		// clock their age would mean nothing.
		cfg.EngineMetricsInterval = -1
	}
	for i := range n {
		h, kvEvents, err := newBackend()
		if err != nil {
			f.stop()
			return nil, err
		}
		u, stop, err := serve(h)
		if err != nil {
			f.stop()
			return nil, err
		}
		stops = append(stops, stop)
		f.simURLs = append(f.simURLs, u)
		// Rendezvous by name, not by the ephemeral port: the same seed
		// then makes the same decisions.
		bc := router.BackendConfig{URL: u, ID: fmt.Sprintf("sim-%d", i), KVEvents: kvEvents}
		if o.SpeedsConfigured {
			bc.Speed = o.speed(i)
		}
		cfg.Backends = append(cfg.Backends, bc)
	}
	for i := range replicas {
		var onEvent func(router.Event)
		if o.ReplicaSync && replicas > 1 {
			// Synchronous: every replica knows of a request before it
			// reaches its backend, so the replay stays reproducible.
			from := strconv.Itoa(i)
			onEvent = func(e router.Event) {
				for j, r := range f.routers {
					if j != i {
						r.rt.Observe(from, e)
					}
				}
			}
		}
		r, stop, err := startRouter(ctx, cfg, o.Seed, uint64(i), now, onEvent)
		if err != nil {
			f.stop()
			return nil, err
		}
		stops = append(stops, stop)
		f.routers = append(f.routers, r)
	}
	return f, nil
}

// startRouter runs one router replica over cfg's backends. Each draws its
// own random numbers (the random strategy's, under its own lock).
func startRouter(ctx context.Context, cfg router.Config, seed, index uint64, now func() time.Time, onEvent func(router.Event)) (replica, func(), error) {
	src := router.NewStaticSource(router.StaticEndpoints(&cfg), nil)
	reg := prometheus.NewRegistry()
	rng := rand.New(rand.NewPCG(seed, 0x62656e6368+index))
	rt, err := router.New(cfg, router.Options{Source: src, HashKey: prefix.KeyFromBytes([]byte("bench")), Rand: rng.Uint64,
		Logger: slog.New(slog.DiscardHandler), Registry: reg, OnEvent: onEvent, Now: now})
	if err != nil {
		return replica{}, nil, err
	}
	rt.ProbeOnce(ctx) // learn each backend's KV size before traffic
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = rt.Run(rctx); close(done) }()
	u, stopServe, err := serve(rt)
	if err != nil {
		cancel()
		<-done
		return replica{}, nil, err
	}
	return replica{rt: rt, url: u, reg: reg, src: src}, func() { stopServe(); cancel(); <-done }, nil
}

// newClient is the load generator's client. It runs in the router's process,
// so its garbage (net's generic copy allocates a buffer per request body that
// does not fit the write buffer) would trigger collections that stall the
// router being measured: bodies up to 64 KiB are copied into the buffer.
func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 4096, DisableCompression: true,
		IdleConnTimeout: time.Minute, WriteBufferSize: 64 << 10}}
}

// virtualSim makes a simulator config run on clock: no wall-time scaling,
// and decode in one step (only the first and last byte matter to routing).
func virtualSim(c llmsim.Config, clock *llmsim.VirtualClock) llmsim.Config {
	c.Clock = clock
	c.TimeScale = 1
	c.ChunkInterval = 24 * time.Hour
	return c
}
