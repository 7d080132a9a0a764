package netlab

import (
	"fmt"
	"math"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// MetricSum adds up every sample of the metric called name in Prometheus
// text exposition format, parsed by expfmt (the parser Prometheus itself
// uses). Samples of other metrics are ignored; a histogram's or summary's
// name_sum and name_count are its sample sums and counts, and the bare
// family name of one has no samples. NaN samples are skipped. found is
// false when no sample of name exists.
//
// name may carry a label selector, as in name{direction="in"}: then only the
// samples whose labels include every pair given are added.
func MetricSum(text, name string) (sum float64, found bool, err error) {
	name, want, err := parseSelector(name)
	if err != nil {
		return 0, false, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return 0, false, fmt.Errorf("metrics: %w", err)
	}
	add := func(v float64) {
		if !math.IsNaN(v) {
			sum += v
			found = true
		}
	}
	for _, m := range fams[name].GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		switch {
		case m.Counter != nil:
			add(m.Counter.GetValue())
		case m.Gauge != nil:
			add(m.Gauge.GetValue())
		case m.Untyped != nil:
			add(m.Untyped.GetValue())
		}
	}
	for _, suffix := range []string{"_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			for _, m := range fams[base].GetMetric() {
				if !hasLabels(m, want) {
					continue
				}
				if v, ok := sumOrCount(m, suffix == "_sum"); ok {
					add(v)
				}
			}
		}
	}
	return sum, found, nil
}

// sumOrCount is a histogram's or summary's sample sum (or count).
func sumOrCount(m *dto.Metric, wantSum bool) (float64, bool) {
	switch {
	case m.Histogram != nil && wantSum:
		return m.Histogram.GetSampleSum(), true
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount()), true
	case m.Summary != nil && wantSum:
		return m.Summary.GetSampleSum(), true
	case m.Summary != nil:
		return float64(m.Summary.GetSampleCount()), true
	}
	return 0, false
}

// parseSelector splits name{k="v",...} into the name and its label pairs,
// read by the same parser as the samples (a sample line with value 0).
func parseSelector(sel string) (string, map[string]string, error) {
	base, _, ok := strings.Cut(sel, "{")
	if !ok {
		return sel, nil, nil
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(sel + " 0\n"))
	if err != nil {
		return "", nil, fmt.Errorf("metric selector %q: %w", sel, err)
	}
	ms := fams[base].GetMetric()
	if len(ms) != 1 {
		return "", nil, fmt.Errorf("metric selector %q: want name{label=\"value\",...}", sel)
	}
	want := map[string]string{}
	for _, lp := range ms[0].GetLabel() {
		want[lp.GetName()] = lp.GetValue()
	}
	return base, want, nil
}

// hasLabels reports whether m carries every label pair in want.
func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}
