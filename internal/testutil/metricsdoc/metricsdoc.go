// Package metricsdoc writes the metrics reference (docs/metrics.md) from
// the collectors the daemon and router register. It is test support: only
// the reference's test imports it.
package metricsdoc

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metric is one entry of the metrics reference.
type Metric struct {
	Name, Type, Help string
	// Labels are the label names, constant ones with their value (k="v").
	Labels []string
}

// Reference lists the metrics collectors export whose names start with
// prefix, sorted by name; several collectors of one name (one per constant
// label value) make one entry. A metric's type comes from the collector's
// kind (a vector, which may have no series yet) or from what it collects:
// a custom collector shows each of its metrics' types by collecting a
// series of it (gossip's starts its counters at zero for that). One whose
// type cannot be told is an error rather than a guess.
func Reference(prefix string, cs []prometheus.Collector) ([]Metric, error) {
	byName := map[string]*Metric{}
	var errs []error
	for _, c := range cs {
		types := collectedTypes(c)
		descs := make(chan *prometheus.Desc)
		go func() { c.Describe(descs); close(descs) }()
		for d := range descs {
			m, err := parseDesc(d.String())
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !strings.HasPrefix(m.Name, prefix) {
				continue
			}
			if m.Type = vecType(c); m.Type == "" {
				m.Type = types[d.String()]
			}
			if m.Type == "" {
				errs = append(errs, fmt.Errorf("metric %s: type unknown: its collector emitted no sample", m.Name))
				continue
			}
			if have, ok := byName[m.Name]; ok {
				for _, l := range m.Labels {
					if !slices.Contains(have.Labels, l) {
						have.Labels = append(have.Labels, l)
					}
				}
				continue
			}
			byName[m.Name] = &m
		}
	}
	out := make([]Metric, 0, len(byName))
	for _, m := range byName {
		slices.Sort(m.Labels)
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Metric) int { return strings.Compare(a.Name, b.Name) })
	return out, errors.Join(errs...)
}

// vecType is the type of a vector collector, which may have no series yet.
func vecType(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	}
	return ""
}

// collectedTypes maps each description c collects to its type.
func collectedTypes(c prometheus.Collector) map[string]string {
	ch := make(chan prometheus.Metric)
	go func() { c.Collect(ch); close(ch) }()
	types := map[string]string{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		t := ""
		switch {
		case pb.Counter != nil:
			t = "counter"
		case pb.Gauge != nil:
			t = "gauge"
		case pb.Histogram != nil:
			t = "histogram"
		case pb.Summary != nil:
			t = "summary"
		case pb.Untyped != nil:
			t = "untyped"
		}
		types[m.Desc().String()] = t
	}
	return types
}

// parseDesc reads what client_golang's Desc.String prints:
// Desc{fqName: "n", help: "h", unit: "u", constLabels: {k="v",...}, variableLabels: {a,b}}.
func parseDesc(s string) (Metric, error) {
	bad := func(why string) (Metric, error) { return Metric{}, fmt.Errorf("metric description %q: %s", s, why) }
	rest := s
	field := func(prefix string) (string, bool) {
		var ok bool
		if rest, ok = strings.CutPrefix(rest, prefix); !ok {
			return "", false
		}
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return "", false
		}
		rest = rest[len(q):]
		v, err := strconv.Unquote(q)
		return v, err == nil
	}
	var m Metric
	var ok bool
	if m.Name, ok = field("Desc{fqName: "); !ok {
		return bad("no name")
	}
	if m.Help, ok = field(", help: "); !ok {
		return bad("no help")
	}
	if _, ok = field(", unit: "); !ok {
		return bad("no unit")
	}
	if rest, ok = strings.CutPrefix(rest, ", constLabels: {"); !ok {
		return bad("no constant labels")
	}
	for !strings.HasPrefix(rest, "}") {
		k, after, found := strings.Cut(rest, "=")
		if !found {
			return bad("constant label without a value")
		}
		rest = after
		v, ok := field("")
		if !ok {
			return bad("constant label value not quoted")
		}
		m.Labels = append(m.Labels, fmt.Sprintf("%s=%q", k, v))
		rest = strings.TrimPrefix(rest, ",")
	}
	vars, found := strings.CutPrefix(rest, "}, variableLabels: {")
	if vars, ok = strings.CutSuffix(vars, "}}"); !found || !ok {
		return bad("no variable labels")
	}
	for _, l := range strings.Split(vars, ",") {
		if l != "" {
			m.Labels = append(m.Labels, l)
		}
	}
	return m, nil
}

// Markdown writes a reference table for each titled list of metrics.
func Markdown(header string, sections []Section) []byte {
	var b bytes.Buffer
	b.WriteString(header)
	for _, s := range sections {
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n| name | type | labels | help |\n| --- | --- | --- | --- |\n", s.Title, s.Intro)
		for _, m := range s.Metrics {
			labels := "—"
			if len(m.Labels) > 0 {
				labels = "`" + strings.Join(m.Labels, "`, `") + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.Name, m.Type, labels, strings.ReplaceAll(m.Help, "|", `\|`))
		}
	}
	return b.Bytes()
}

// Section is a titled part of the reference.
type Section struct {
	Title, Intro string
	Metrics      []Metric
}
