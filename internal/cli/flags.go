package cli

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// listFlag collects a repeatable flag; a value may also hold several items
// separated by commas (as from an environment variable or config file).
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*l = append(*l, item)
		}
	}
	return nil
}

// byteSize is a flag holding a size such as 512MiB, 10GB or 1048576.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(v string) error {
	n, err := parseBytes(v)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
}

// parseBytes parses a non-negative byte count with an optional unit.
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	num := s
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || !(f >= 0 && f*float64(mult) <= 1<<62) { // also rejects NaN
		return 0, fmt.Errorf("size %q: want a non-negative number with an optional unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	return int64(f * float64(mult)), nil
}

// loadConfigFile reads a YAML file of flag names to values (lists allowed).
func loadConfigFile(path string) (map[string]string, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parseConfig(data)
}

func parseConfig(data []byte) (map[string]string, error) {
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		switch v := v.(type) {
		case []any:
			items := make([]string, len(v))
			for i, item := range v {
				if _, nested := item.(map[string]any); nested {
					return nil, fmt.Errorf("config key %q: list items must be plain values", k)
				}
				items[i] = fmt.Sprint(item)
			}
			out[k] = strings.Join(items, ",")
		case map[string]any:
			return nil, fmt.Errorf("config key %q: want a value or a list, not a map", k)
		case nil:
		default:
			out[k] = fmt.Sprint(v)
		}
	}
	return out, nil
}
