package router

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's Prometheus series. Labels never carry request
// content or caller-chosen strings (model names could be anything), only
// configured backends, strategies, reasons and status codes.
type metrics struct {
	decisions      *prometheus.CounterVec
	overflows      *prometheus.CounterVec
	cachedFraction prometheus.Histogram
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

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	latency := prometheus.ExponentialBucketsRange(0.001, 120, 24)
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_router_decisions_total",
			Help: "Routing decisions by strategy and reason (hit, cold, overflow, retry, random, least).",
		}, []string{"strategy", "reason"}),
		overflows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_router_overflows_total",
			Help: "Overflow decisions by the rule the preferred backend failed (limit, load, share, wait).",
		}, []string{"strategy", "bound"}),
		cachedFraction: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "warmfleet_router_cached_prefix_fraction",
			Help:    "Estimated fraction of each routed prompt already cached on the chosen backend.",
			Buckets: prometheus.LinearBuckets(0, 0.1, 11),
		}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_router_backend_inflight",
			Help: "Requests in flight per backend.",
		}, []string{"backend"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warmfleet_router_ttfb_seconds",
			Help:    "Time from request arrival to the first response byte sent to the client.",
			Buckets: latency,
		}, []string{"strategy"}),
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
		for _, c := range []prometheus.Collector{m.decisions, m.overflows, m.cachedFraction, m.inflight, m.ttfb, m.duration,
			m.decisionTime, m.queueWait, m.rejected, m.ejections, m.failures, m.healthy} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("router metrics: %w", err)
			}
		}
	}
	return m, nil
}
