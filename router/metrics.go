package router

import (
	"cmp"
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's Prometheus series. Labels never carry request
// content or caller-chosen strings, only configured backends, strategies,
// reasons, status codes and models: a model label is the model's name when
// the configuration or an endpoint names it (a per-model strategy, a
// backend's models list, an endpoint's advertised models), else "other",
// so callers naming made-up models cannot grow the series.
type metrics struct {
	decisions      *prometheus.CounterVec
	overflows      *prometheus.CounterVec
	requests       *prometheus.CounterVec
	buildInfo      *prometheus.GaugeVec
	cachedFraction *prometheus.HistogramVec
	inflight       *prometheus.GaugeVec
	ttfb           *prometheus.HistogramVec
	duration       *prometheus.HistogramVec
	decisionTime   prometheus.Histogram
	queueWait      prometheus.Histogram
	rejected       *prometheus.CounterVec
	ejections      *prometheus.CounterVec
	failures       *prometheus.CounterVec
	healthy        *prometheus.GaugeVec
}

// otherModel is the model label of a model the configuration does not name.
const otherModel = "other"

func newMetrics(reg prometheus.Registerer, version string) (*metrics, error) {
	latency := prometheus.ExponentialBucketsRange(0.001, 120, 24)
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_router_decisions_total",
			Help: "Routing decisions by strategy, reason (hit, cold, overflow, retry, random, least) and model.",
		}, []string{"strategy", "reason", "model"}),
		overflows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_router_overflows_total",
			Help: "Overflow decisions by the rule the preferred backend failed (limit, load, share, wait; slots: every sequence slot of its engine busy while another backend had one free; kv: too little free KV cache, self-tuning) and model.",
		}, []string{"strategy", "bound", "model"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_router_requests_total",
			Help: "Requests (attempts) sent to a backend, by model and whether its node held the model's weights warm (warm) or not yet (cold).",
		}, []string{"model", "weights"}),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_router_build_info",
			Help: "Always 1; the router's version and Go version as labels.",
		}, []string{"version", "goversion"}),
		cachedFraction: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warmfleet_router_cached_prefix_ratio",
			Help:    "Estimated ratio of each routed prompt already cached on the chosen backend, by model.",
			Buckets: prometheus.LinearBuckets(0, 0.1, 11),
		}, []string{"model"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_router_backend_inflight",
			Help: "Requests in flight per backend.",
		}, []string{"backend"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warmfleet_router_ttfb_seconds",
			Help:    "Time from request arrival to the first response byte sent to the client, by strategy and model.",
			Buckets: latency,
		}, []string{"strategy", "model"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warmfleet_router_request_duration_seconds",
			Help:    "Time from request arrival to the end of the response, by status code.",
			Buckets: latency,
		}, []string{"code"}),
		decisionTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "warmfleet_router_decision_seconds",
			Help:    "Time to hash the prompt and choose a backend.",
			Buckets: prometheus.ExponentialBucketsRange(1e-6, 0.01, 20),
		}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "warmfleet_router_queue_wait_seconds",
			Help:    "Time requests waited because every eligible backend was at its limit.",
			Buckets: latency,
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_router_rejected_total",
			Help: "Requests answered by the router itself with an error, by status code.",
		}, []string{"code"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_router_backend_ejections_total",
			Help: "Times a backend was ejected after a connect error, timeout, run of 5xx answers or failed probe.",
		}, []string{"backend"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_router_backend_failures_total",
			Help: "Requests a backend failed after accepting them, by kind (first_byte_timeout, idle_timeout, broken_stream, broken_before_answer).",
		}, []string{"backend", "kind"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_router_backend_healthy",
			Help: "1 if the backend is eligible for traffic, 0 while ejected.",
		}, []string{"backend"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.overflows, m.requests, m.buildInfo, m.cachedFraction, m.inflight, m.ttfb, m.duration,
			m.decisionTime, m.queueWait, m.rejected, m.ejections, m.failures, m.healthy} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("router metrics: %w", err)
			}
		}
	}
	m.buildInfo.WithLabelValues(cmp.Or(version, "dev"), runtime.Version()).Set(1)
	return m, nil
}
