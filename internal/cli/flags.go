package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
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

// Type names the value in help.
func (l *listFlag) Type() string { return "list" }

// byteSize is a flag holding a size such as 512MiB, 10GB or 1048576.
type byteSize int64

// String is the size in the largest binary unit that holds it exactly
// (1GiB, 64MiB, 1500), so help reads in human units and the text parses
// back to the same size.
func (b *byteSize) String() string { return exactSize(int64(*b)) }

func (b *byteSize) Set(v string) error {
	n, err := bytesize.Parse(v)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

// Type names the value in help.
func (b *byteSize) Type() string { return "size" }

// exactSize renders n in the largest binary unit that divides it.
func exactSize(n int64) string {
	if n == 0 {
		return "0"
	}
	for i, unit := range []string{"EiB", "PiB", "TiB", "GiB", "MiB", "KiB"} {
		if div := int64(1) << (10 * (6 - i)); n%div == 0 {
			return strconv.FormatInt(n/div, 10) + unit
		}
	}
	return strconv.FormatInt(n, 10)
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

// flagSet is the flag set every product command's flags register on.
type flagSet = pflag.FlagSet

// newFlagSet returns a flag set for a command that parses its own
// arguments (the daemon and the router run in-process by the lab): it
// reports errors instead of exiting.
func newFlagSet(e *Env, name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet("warmfleet "+name, pflag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	return fs
}

// parseFlags parses args, then fills every flag not given on the command
// line from the environment and file (see layerFlags).
func parseFlags(fs *pflag.FlagSet, e *Env, args []string, file map[string]string) error {
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return layerFlags(fs, e, file)
}

// layerFlags fills every flag of fs not given on the command line from
// WARMFLEET_<FLAG_NAME> (dashes become underscores) and then from file
// (keys are flag names). Values are validated by the flags themselves. A
// flag set this way counts as given (pflag's Changed), so a second call
// with a file keeps what the environment set.
func layerFlags(fs *pflag.FlagSet, e *Env, file map[string]string) error {
	var names []string
	given := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" && f.Name != "version" {
			names = append(names, f.Name)
			given[f.Name] = f.Changed
		}
	})
	return layer(names, given, fs.Set, e, file)
}

// layerStdFlags is layerFlags for a flag set of Go's flag package (the
// lab's commands).
func layerStdFlags(fs *flag.FlagSet, e *Env) error {
	var names []string
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return layer(names, given, fs.Set, e, nil)
}

// layer sets each flag of names not given from the environment, else from
// file; a key of file that is not a flag is an error.
func layer(names []string, given map[string]bool, set func(name, value string) error, e *Env, file map[string]string) error {
	var errs []error
	for k := range file {
		if _, ok := given[k]; !ok || k == "config" {
			errs = append(errs, fmt.Errorf("config key %q is not a flag of this command", k))
		}
	}
	for _, name := range names {
		if given[name] {
			continue
		}
		key := "WARMFLEET_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		if v := e.Getenv(key); v != "" {
			if err := set(name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", key, v, err))
			}
			continue
		}
		if v, ok := file[name]; ok {
			if err := set(name, v); err != nil {
				errs = append(errs, fmt.Errorf("config key %q=%q: %w", name, v, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}
