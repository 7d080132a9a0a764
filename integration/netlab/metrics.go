package netlab

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MetricSum adds up every sample of the metric called name in Prometheus
// text exposition format. Samples of other metrics, including name's
// _bucket/_sum/_count relatives, are ignored. found is false when no sample
// of name exists.
func MetricSum(text, name string) (sum float64, found bool, err error) {
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ' && rest[0] != '\t') {
			continue
		}
		if rest[0] == '{' {
			end, err := labelsEnd(rest)
			if err != nil {
				return 0, false, fmt.Errorf("metrics line %d: %w", i+1, err)
			}
			rest = rest[end:]
		}
		f := strings.Fields(rest)
		if len(f) < 1 || len(f) > 2 {
			return 0, false, fmt.Errorf("metrics line %d: want a value and an optional timestamp: %q", i+1, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("metrics line %d: value %q: %w", i+1, f[0], err)
		}
		if math.IsNaN(v) {
			continue
		}
		sum += v
		found = true
	}
	return sum, found, nil
}

// labelsEnd returns the index just past the '}' closing the label set that
// s starts with, honouring quoted values with escapes.
func labelsEnd(s string) (int, error) {
	inQuote := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated label set %q", s)
}
