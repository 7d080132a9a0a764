package imagecache

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the cache's Prometheus series (prefix warmfleet_image_).
type metrics struct {
	pulls      *prometheus.CounterVec // result: pulled, present, failed
	failures   *prometheus.CounterVec // reason: see errorReason
	bytes      prometheus.Counter
	duration   prometheus.Histogram
	inFlight   prometheus.Gauge
	removals   prometheus.Counter
	collectors []prometheus.Collector
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_image_pulls_total",
			Help: "Image ensure operations by result: pulled (fetched from a registry), present (already there), failed.",
		}, []string{"result"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_image_pull_failures_total",
			Help: "Failed image pulls by reason: not_found, unauthorized, unreachable, canceled, other.",
		}, []string{"reason"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmfleet_image_bytes_fetched_total",
			Help: "Bytes of image config and layers fetched from registries.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "warmfleet_image_pull_duration_seconds",
			Help:    "Duration of image pulls (fetch and unpack), successful or not.",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 14), // 0.25 s .. ~34 min
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "warmfleet_image_pulls_in_flight",
			Help: "Image pulls currently running.",
		}),
		removals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmfleet_image_removals_total",
			Help: "Images removed from containerd after their last owner released them.",
		}),
	}
	m.collectors = []prometheus.Collector{m.pulls, m.failures, m.bytes, m.duration, m.inFlight, m.removals}
	// Series exist from the start, so a dashboard shows 0 rather than
	// nothing before the first failure.
	for _, r := range []string{"pulled", "present", "failed"} {
		m.pulls.WithLabelValues(r)
	}
	for _, r := range allReasons {
		m.failures.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for i, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range m.collectors[:i] {
				reg.Unregister(done)
			}
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("image cache metrics: %w (one cache per registerer)", err)
			}
			return nil, fmt.Errorf("image cache metrics: %w", err)
		}
	}
	return m, nil
}
