package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/internal/bytesize"
)

// runOut runs the product command line and returns its exit code, stdout
// and stderr.
func runOut(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Run(t.Context(), args, &Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }})
	return code, out.String(), errOut.String()
}

// everyCommand lists the visible commands of the product's tree, root
// first, each as its path of names after the program's.
func everyCommand() [][]string {
	var out [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		out = append(out, path)
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				walk(sub, append(append([]string{}, path...), sub.Name()))
			}
		}
	}
	walk(newRoot("warmfleet", nil, &Env{}), []string{})
	return out
}

// garbledFlag matches a help line whose flag's value name has a space in
// it: pflag takes a back-quoted word of the usage text as the value name.
var garbledFlag = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--[\w-]+ \S+ \S`)

// TestHelpEveryCommand: every command's --help, groups too, exits 0 and
// shows its usage line and examples; a group lists its verbs; no flag line
// is garbled.
func TestHelpEveryCommand(t *testing.T) {
	root := newRoot("warmfleet", nil, &Env{})
	cmds := everyCommand()
	if len(cmds) < 25 {
		t.Fatalf("only %d commands found", len(cmds))
	}
	for _, path := range cmds {
		code, out, stderr := runOut(t, append(path, "--help")...)
		name := "warmfleet " + strings.Join(path, " ")
		if code != 0 || !strings.Contains(out, "Usage:") || !strings.Contains(out, "Examples:") {
			t.Errorf("%s --help: exit %d, stderr %q, stdout:\n%s\nwant exit 0 with usage and examples", name, code, stderr, out)
			continue
		}
		if m := garbledFlag.FindString(out); m != "" {
			t.Errorf("%s --help: garbled flag line %q", name, m)
		}
		cmd, _, err := root.Find(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() && !regexp.MustCompile(`(?m)^\s+`+sub.Name()+`\s`).MatchString(out) {
				t.Errorf("%s --help does not list %s:\n%s", name, sub.Name(), out)
			}
		}
	}
}

// TestHelpShowsArguments: a command that takes a positional argument names
// it in its usage line.
func TestHelpShowsArguments(t *testing.T) {
	for cmd, want := range map[string]string{
		"cache add": "warmfleet cache add NAME --source", "cache status": "warmfleet cache status NAME",
		"cache rm": "warmfleet cache rm NAME", "cache verify": "warmfleet cache verify NAME",
		"image add": "warmfleet image add REF", "image rm": "warmfleet image rm REF",
		"endpoint add": "warmfleet endpoint add --model MODEL --url URL",
	} {
		if _, out, _ := runOut(t, append(strings.Fields(cmd), "--help")...); !strings.Contains(out, want) {
			t.Errorf("%s --help lacks %q:\n%s", cmd, want, out)
		}
	}
}

// TestGroupWithoutVerb: a group on its own or with a verb it does not have
// is a usage error (exit 2) that lists its verbs.
func TestGroupWithoutVerb(t *testing.T) {
	for _, args := range [][]string{{"cache"}, {"cache", "nope"}, {"image"}, {"endpoint", "nope"}} {
		code, _, stderr := runOut(t, args...)
		if code != exitUsage || !strings.Contains(stderr, "add, ls") {
			t.Errorf("%q: exit %d, stderr %q; want 2 listing the verbs", args, code, stderr)
		}
	}
}

// TestExitCodesDocumented: the root help documents every exit code the
// command line uses, with the meaning exitCode gives it.
func TestExitCodesDocumented(t *testing.T) {
	_, out, _ := runOut(t, "--help")
	for code, meaning := range map[int]string{0: "success", exitFailure: "failure", exitUsage: "usage", exitNotFound: "not found", exitTimeout: "timed out"} {
		if !regexp.MustCompile(`(?m)^\s+` + string(rune('0'+code)) + `\s+` + meaning).MatchString(out) {
			t.Errorf("root help does not document exit code %d (%s):\n%s", code, meaning, out)
		}
	}
	if exitCode(errTimeout) != exitTimeout || exitCode(usageError("x")) != exitUsage {
		t.Error("exitCode does not map the errors as documented")
	}
}

// TestCompletion: completion scripts for bash, zsh and fish.
func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		code, out, stderr := runOut(t, "completion", shell)
		if code != 0 || !strings.Contains(out, "warmfleet") || len(out) < 1000 {
			t.Errorf("completion %s: exit %d, %d bytes, stderr %q", shell, code, len(out), stderr)
		}
	}
	// The script asks the binary; -o completes to its formats.
	code, out, _ := runOut(t, "__complete", "cache", "ls", "-o", "")
	if code != 0 || !strings.Contains(out, "yaml") {
		t.Errorf("completing -o: exit %d, %q", code, out)
	}
}

// TestVersion: `version` and --version print the same line.
func TestVersion(t *testing.T) {
	_, byCommand, _ := runOut(t, "version")
	_, byFlag, _ := runOut(t, "--version")
	if byCommand != byFlag || !strings.HasPrefix(byCommand, "warmfleet "+Version()) {
		t.Errorf("version %q, --version %q", byCommand, byFlag)
	}
}

func TestDescribeBuild(t *testing.T) {
	stamped := &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-11-30T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	for _, c := range []struct {
		linked string
		bi     *debug.BuildInfo
		want   string
	}{
		{"", stamped, "v1.4.0 (commit 0123456789ab, 2026-11-30T10:00:00Z, modified)"},
		{"v2.0.0", stamped, "v2.0.0 (commit 0123456789ab, 2026-11-30T10:00:00Z, modified)"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}, "dev (commit abc)"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev (no VCS commit recorded: built outside a git checkout or with -buildvcs=false)"},
		{"", nil, "dev"},
	} {
		if got := describeBuild(c.linked, c.bi); got != c.want {
			t.Errorf("describeBuild(%q, %+v) = %q, want %q", c.linked, c.bi, got, c.want)
		}
	}
}

// TestPrintOut: the one output helper every listing uses.
func TestPrintOut(t *testing.T) {
	type row struct {
		Name  string `json:"name"`
		Bytes int64  `json:"bytes_total"`
		Ready bool   `json:"ready"`
		Note  string `json:"note"`
		Zero  string `json:"zero"`
	}
	v := []row{{Name: "llama", Bytes: 16 << 30, Ready: true, Note: "true", Zero: ""}}
	for format, want := range map[string]string{
		"json": "[\n  {\n    \"name\": \"llama\",\n    \"bytes_total\": 17179869184,\n    \"ready\": true,\n    \"note\": \"true\",\n    \"zero\": \"\"\n  }\n]\n",
		"yaml": "- name: llama\n  bytes_total: 17179869184\n  ready: true\n  note: \"true\"\n  zero: \"\"\n",
	} {
		var out bytes.Buffer
		if err := printOut(&out, format, v, nil); err != nil || out.String() != want {
			t.Errorf("-o %s: %v\n%s\nwant\n%s", format, err, out.String(), want)
		}
	}
	var out bytes.Buffer
	table := func(w io.Writer, rows []row) error {
		_, err := io.WriteString(w, "NAME\n"+rows[0].Name+"\n")
		return err
	}
	if err := printOut(&out, "table", v, table); err != nil || out.String() != "NAME\nllama\n" {
		t.Errorf("-o table: %v %q", err, out.String())
	}
	if err := printOut(&bytes.Buffer{}, "xml", v, table); exitCode(err) != exitUsage {
		t.Errorf("-o xml: %v, want a usage error", err)
	}
}

// TestSizeFlagText: sizes show in human units in help and parse back.
func TestSizeFlagText(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1 << 30: "1GiB", 16 << 20: "16MiB", 1536 << 20: "1536MiB", 1500: "1500", 5 << 40: "5TiB"} {
		b := byteSize(n)
		if got := b.String(); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
		if back, err := bytesize.Parse(want); err != nil || back != n {
			t.Errorf("%q parses back to %d, %v", want, back, err)
		}
	}
	if _, out, _ := runOut(t, "daemon", "--help"); !strings.Contains(out, "(default 1GiB)") {
		t.Errorf("daemon --help shows --reserve's default not in human units:\n%s", out)
	}
}

// TestLabCommands: a binary's own commands (the lab's, on Go's flag
// package) run next to the product's: their --help exits 0, a bad flag 2,
// and a name the product has stays the product's.
func TestLabCommands(t *testing.T) {
	var ran []string
	raw := func(name string) Command {
		return Command{Name: name, Summary: "a lab command", Run: func(ctx context.Context, e *Env, args []string) error {
			fs := NewFlagSet(e, name)
			n := fs.Int("n", 1, "how many")
			if err := ParseFlags(fs, e, args); err != nil {
				return err
			}
			ran = append(ran, fmt.Sprintf("%s %d", name, *n))
			return nil
		}}
	}
	cmds := []Command{raw("bench"), raw("cache")}
	for _, c := range []struct {
		args []string
		code int
		ran  string
	}{
		{[]string{"bench", "-n", "3"}, 0, "bench 3"},
		{[]string{"bench", "--help"}, 0, ""},
		{[]string{"bench", "-n", "x"}, exitUsage, ""},
		{[]string{"cache", "-n", "3"}, exitUsage, ""}, // the product's cache group
		{[]string{"cache", "--help"}, 0, ""},
	} {
		ran = nil
		var out, errOut bytes.Buffer
		code := Dispatch(t.Context(), "warmfleet-lab", cmds, c.args, &Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }})
		if code != c.code || strings.Join(ran, ",") != c.ran {
			t.Errorf("%q: exit %d, ran %q; want %d, %q (stderr %q)", c.args, code, ran, c.code, c.ran, errOut.String())
		}
	}
}
