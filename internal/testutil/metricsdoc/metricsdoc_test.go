package metricsdoc

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestReference reads a collector's name, type, help and labels, joins
// collectors of one name, and refuses to guess a type it cannot see.
func TestReference(t *testing.T) {
	vec := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x_state", Help: `1 for "the" state, {braces}, a|pipe.`}, []string{"model", "state"})
	in := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x_bytes_total", Help: "Bytes.", ConstLabels: prometheus.Labels{"direction": "in"}}, func() float64 { return 1 })
	out := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x_bytes_total", Help: "Bytes.", ConstLabels: prometheus.Labels{"direction": "out"}}, func() float64 { return 2 })
	other := prometheus.NewGauge(prometheus.GaugeOpts{Name: "y_other", Help: "Not ours."})
	got, err := Reference("x_", []prometheus.Collector{vec, in, out, other})
	if err != nil {
		t.Fatal(err)
	}
	want := []Metric{
		{Name: "x_bytes_total", Type: "counter", Help: "Bytes.", Labels: []string{`direction="in"`, `direction="out"`}},
		{Name: "x_state", Type: "gauge", Help: `1 for "the" state, {braces}, a|pipe.`, Labels: []string{"model", "state"}},
	}
	if !slices.EqualFunc(got, want, func(a, b Metric) bool {
		return a.Name == b.Name && a.Type == b.Type && a.Help == b.Help && slices.Equal(a.Labels, b.Labels)
	}) {
		t.Fatalf("reference %+v\nwant %+v", got, want)
	}
	if md := string(Markdown("", []Section{{Title: "T", Metrics: got}})); !strings.Contains(md, `a\|pipe`) {
		t.Errorf("a | in help breaks the table:\n%s", md)
	}

	silent := prometheus.NewDesc("x_silent", "Emits nothing.", nil, nil)
	if _, err := Reference("x_", []prometheus.Collector{silentCollector{silent}}); err == nil || !strings.Contains(err.Error(), "x_silent: type unknown") {
		t.Fatalf("a collector emitting nothing: %v, want a type-unknown error", err)
	}
}

type silentCollector struct{ d *prometheus.Desc }

func (c silentCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.d }
func (c silentCollector) Collect(chan<- prometheus.Metric)    {}
