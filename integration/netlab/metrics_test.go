package netlab

import (
	"math"
	"strings"
	"testing"
)

func TestMetricSum(t *testing.T) {
	const text = `# HELP warmfleet_s3_bytes_total Bytes read from S3.
# TYPE warmfleet_s3_bytes_total counter
warmfleet_s3_bytes_total 1.048576e+06
warmfleet_s3_bytes_total_other 5
warmfleet_peer_bytes_total{peer="h1"} 100
warmfleet_peer_bytes_total{peer="h}2",note="a \"q\" b"} 23 1700000000000
warmfleet_download_duration_seconds_bucket{le="1"} 3
warmfleet_download_duration_seconds_sum 7
warmfleet_nan NaN
`
	tests := []struct {
		name  string
		want  float64
		found bool
	}{
		{"warmfleet_s3_bytes_total", 1 << 20, true},
		{"warmfleet_peer_bytes_total", 123, true},
		{"warmfleet_download_duration_seconds", 0, false},
		{"warmfleet_download_duration_seconds_sum", 7, true},
		{"warmfleet_missing", 0, false},
		{"warmfleet_nan", 0, false},
	}
	for _, tt := range tests {
		got, found, err := MetricSum(text, tt.name)
		if err != nil || got != tt.want || found != tt.found {
			t.Errorf("MetricSum(%s) = %v, %v, %v; want %v, %v", tt.name, got, found, err, tt.want, tt.found)
		}
	}
}

func TestMetricSumBad(t *testing.T) {
	for _, text := range []string{
		`m{a="b" 1`,
		`m abc`,
		`m 1 2 3`,
		`m{a="\"} 1`,
		`m 1 abc`,
	} {
		if _, _, err := MetricSum(text, "m"); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("MetricSum(%q) err = %v, want an error naming line 1", text, err)
		}
	}
}

func FuzzMetricSum(f *testing.F) {
	f.Add("m 1\nm{a=\"x\"} 2\n")
	f.Add("m{a=\"}\\\"\"} +Inf")
	f.Add("# m 1\nm")
	f.Fuzz(func(t *testing.T, text string) {
		sum, found, err := MetricSum(text, "m")
		if err != nil && (found || sum != 0) {
			t.Fatalf("error %v with a result %v, %v", err, sum, found)
		}
		if !found && sum != 0 && !math.IsNaN(sum) {
			t.Fatalf("sum %v without a sample", sum)
		}
	})
}

// TestMetricSumSelector adds only the samples whose labels match a
// selector given with the name (the fleet bench reads
// warmfleet_peer_bytes_total{direction="in"} this way).
func TestMetricSumSelector(t *testing.T) {
	text := "# TYPE b counter\nb{direction=\"in\",peer=\"x\"} 3\nb{direction=\"in\",peer=\"y\"} 4\nb{direction=\"out\",peer=\"x\"} 100\n"
	for sel, want := range map[string]float64{`b{direction="in"}`: 7, `b{direction="out"}`: 100, `b`: 107, `b{direction="in",peer="y"}`: 4} {
		got, found, err := MetricSum(text, sel)
		if err != nil || !found || got != want {
			t.Errorf("MetricSum(%s) = %v, %v, %v; want %v", sel, got, found, err, want)
		}
	}
	if _, found, err := MetricSum(text, `b{direction="sideways"}`); err != nil || found {
		t.Errorf("a selector nothing matches: found %v, err %v", found, err)
	}
	if _, _, err := MetricSum(text, `b{direction=`); err == nil {
		t.Error("a malformed selector: no error")
	}
}
