package cli

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/warmfleet/warmfleet/internal/bytesize"
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
	n, err := bytesize.Parse(v)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
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
