package vm_test

import (
	"strings"
	"testing"
)

// TestCompare: the check after each cut names a missing, short, wrong or
// extra file, and passes an exact copy.
func TestCompare(t *testing.T) {
	mod := sourceModel{name: "m", files: map[string]string{"a": "aa", "b/c": "cc"}, sizes: map[string]int64{"a": 1, "b/c": 2}}
	type file = struct {
		Path   string `json:"path"`
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	}
	exact := listing{Files: []file{{"a", 1, "aa"}, {"b/c", 2, "cc"}}}
	if got := compare(exact, mod); got != "" {
		t.Errorf("exact copy: %q", got)
	}
	for _, tc := range []struct {
		files []file
		want  string
	}{
		{[]file{{"a", 1, "aa"}}, "b/c is missing"},
		{[]file{{"a", 1, "aa"}, {"b/c", 1, "cc"}}, "b/c has 1 bytes, want 2"},
		{[]file{{"a", 1, "zz"}, {"b/c", 2, "cc"}}, "a has SHA-256 zz"},
		{[]file{{"a", 1, "aa"}, {"b/c", 2, "cc"}, {"x", 0, ""}}, "x is not in the source"},
	} {
		if got := compare(listing{Files: tc.files}, mod); !strings.Contains(got, tc.want) {
			t.Errorf("compare(%v) = %q, want it to say %q", tc.files, got, tc.want)
		}
	}
}
