package daemon

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/health"
)

// metrics are the daemon's Prometheus series, registered on its own registry
// (no globals), served at /metrics. The registry remembers what it holds,
// for the generated metrics reference.
type metrics struct {
	reg *health.Registry
	// s3Bytes counts bytes read from S3: warmfleet_s3_bytes_total reads it,
	// and so does the inventory.
	s3Bytes atomic.Int64
	// originBytes counts bytes read from model origins, by source kind.
	originBytes *prometheus.CounterVec
	// originCorrupt counts fetch attempts that failed on bytes that did
	// not match the source's digest, by source kind.
	originCorrupt *prometheus.CounterVec
	// written counts the bytes the direct origin download wrote into the
	// cache; swarmWritten, set once the swarm is in use, the bytes the
	// swarm wrote (from S3 and from peers), which it writes itself.
	// warmfleet_cache_written_bytes_total is their sum.
	written      atomic.Int64
	swarmWritten atomic.Pointer[func() int64]
	cacheState   *prometheus.GaugeVec
	cacheBytes   *prometheus.GaugeVec
	cacheTotal   *prometheus.GaugeVec
	downloadTime *prometheus.HistogramVec
	fetches      *prometheus.CounterVec
	available    prometheus.Gauge
	damaged      *prometheus.CounterVec
	// applyDirFiles and applyDirErrors report the watched directory.
	applyDirFiles  *prometheus.GaugeVec
	applyDirErrors prometheus.Counter
	evictions      prometheus.Counter
}

var cacheStates = []string{api.StatePending, api.StateDownloading, api.StateVerifying, api.StateReady, api.StateFailed,
	api.StateInsufficientSpace, api.StateEvicted}

func newMetrics() *metrics {
	reg := health.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &metrics{
		reg: reg,
		originBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_origin_bytes_total", Help: "Bytes read from model origins, by source kind (s3, hf, torrent).",
		}, []string{"source"}),
		originCorrupt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_origin_corrupt_total", Help: "Fetch attempts that failed because the origin's bytes did not match the source's own digest (a Hub file's sha256 or blob id, a torrent's piece SHA-1, an S3 checksum), by source kind.",
		}, []string{"source"}),
		cacheState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_cache_state", Help: "1 for the state each model cache is in, 0 for the others.",
		}, []string{"model", "state"}),
		cacheBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_cache_bytes", Help: "Bytes of a model cache that are complete on disk.",
		}, []string{"model"}),
		cacheTotal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_cache_size_bytes", Help: "Total bytes of a model cache's revision.",
		}, []string{"model"}),
		downloadTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "warmfleet_download_duration_seconds", Help: "Time from the start of a fetch to its end.",
			Buckets: prometheus.ExponentialBuckets(0.5, 2, 14),
		}, []string{"result"}),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_fetches_total", Help: "Fetches by result: ready, unchanged, failed, canceled.",
		}, []string{"result"}),
		available: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "warmfleet_cache_available_bytes", Help: "Space the cache may still use (free less reserve).",
		}),
		damaged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_cache_damaged_total", Help: "Damaged cached files (or current links) found after publish and fetched again.",
		}, []string{"model"}),
		applyDirFiles: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_apply_dir_files", Help: "Files of the watched --apply-dir by state: ok (applied) or error (not applied: see GET /v1/apply-dir).",
		}, []string{"state"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmfleet_cache_evictions_total", Help: "Ready model caches evicted to make room for another (unpinned, of its priority or lower; lowest priority, then least recently used, first).",
		}),
		applyDirErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmfleet_apply_dir_errors_total", Help: "Times a file of the watched --apply-dir failed to apply (counted once per content and error).",
		}),
	}
	f(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "warmfleet_s3_bytes_total", Help: "Bytes read from S3 object bodies.",
	}, func() float64 { return float64(m.s3Bytes.Load()) }))
	for _, kind := range []string{"s3", "hf", "torrent"} {
		m.originBytes.WithLabelValues(kind) // shown at 0 before the first read
		m.originCorrupt.WithLabelValues(kind)
	}
	f(m.originBytes)
	f(m.originCorrupt)
	f(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "warmfleet_cache_written_bytes_total", Help: "Bytes written into the local cache.",
	}, func() float64 {
		n := m.written.Load()
		if swarm := m.swarmWritten.Load(); swarm != nil {
			n += (*swarm)()
		}
		return float64(n)
	}))
	f(m.cacheState)
	f(m.cacheBytes)
	f(m.cacheTotal)
	f(m.downloadTime)
	f(m.fetches)
	f(m.available)
	f(m.damaged)
	f(m.applyDirFiles)
	f(m.applyDirErrors)
	f(m.evictions)
	return m
}

func (m *metrics) setState(model, state string) {
	for _, s := range cacheStates {
		v := 0.0
		if s == state {
			v = 1
		}
		m.cacheState.WithLabelValues(model, s).Set(v)
	}
}

func (m *metrics) forget(model string) {
	for _, s := range cacheStates {
		m.cacheState.DeleteLabelValues(model, s)
	}
	m.cacheBytes.DeleteLabelValues(model)
	m.cacheTotal.DeleteLabelValues(model)
	m.damaged.DeleteLabelValues(model)
}
