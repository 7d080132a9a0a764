package s3bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// metricValue finds an unlabelled sample in Prometheus text exposition.
func metricValue(text, name string) (float64, error) {
	for line := range strings.SplitSeq(text, "\n") {
		rest, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, fmt.Errorf("metric %s: no value", name)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", name, err)
		}
		return v, nil
	}
	return 0, fmt.Errorf("metric %s not exposed", name)
}

// loadAvg is the 1, 5 and 15 minute load averages, or "unknown".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
