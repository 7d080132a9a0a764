package vm

import (
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/integration/vm/agent"
)

// TestCompare: the check after each cut names a missing, short, wrong or
// extra file, and passes an exact copy.
func TestCompare(t *testing.T) {
	mod := sourceModel{name: "m", files: map[string]string{"a": "aa", "b/c": "cc"}, sizes: map[string]int64{"a": 1, "b/c": 2}}
	type file = agent.File
	f := func(path string, size int64, sum string) file { return file{Path: path, Size: size, SHA256: sum} }
	exact := agent.Listing{Files: []file{f("a", 1, "aa"), f("b/c", 2, "cc")}}
	if got := compare(exact, mod); got != "" {
		t.Errorf("exact copy: %q", got)
	}
	for _, tc := range []struct {
		files []file
		want  string
	}{
		{[]file{f("a", 1, "aa")}, "b/c is missing"},
		{[]file{f("a", 1, "aa"), f("b/c", 1, "cc")}, "b/c has 1 bytes, want 2"},
		{[]file{f("a", 1, "zz"), f("b/c", 2, "cc")}, "a has SHA-256 zz"},
		{[]file{f("a", 1, "aa"), f("b/c", 2, "cc"), f("x", 0, "")}, "x is not in the source"},
	} {
		if got := compare(agent.Listing{Files: tc.files}, mod); !strings.Contains(got, tc.want) {
			t.Errorf("compare(%v) = %q, want it to say %q", tc.files, got, tc.want)
		}
	}
}
