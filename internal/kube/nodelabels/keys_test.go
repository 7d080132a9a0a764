package nodelabels

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/validate/content"
)

func TestKeyName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"llama-3-8b", "llama-3-8b"},
		{"Llama-3.1-8B_instruct", "Llama-3.1-8B_instruct"},
		{"meta/llama-3-8b", "meta--llama-3-8b"},
		// '-' cannot end a plain name, so the org form does not apply.
		{"meta-/llama", "meta--llama..pkaf2yhkk2tjq7el"},
		{"a--b", "a--b..scbhulswgyni7v3s"},
		{"a..b", "a..b..6yvueqkmkfh2ncot"},
		{"", "x..4oymiquy7qobjgx3"},
		{"docker.io/vllm/vllm-openai:v0.6.0", "docker.io-vllm-vllm-openai-v0.6.0..4mkdos45ravwmava"},
		{"-leading", "leading..lcrxnx7p66dyunht"},
		{strings.Repeat("a", 63), strings.Repeat("a", 63)},
		{strings.Repeat("a", 64), strings.Repeat("a", 45) + "..77qfj7t24dfw3rs4"},
		{"日本/モデル", "x..pgylgytpx2rixhtx"},
	} {
		// The hashes are the first 16 base32 characters of SHA-256,
		// computed independently (Python's hashlib and base64).
		got := KeyName(tc.in)
		if got != tc.want {
			t.Errorf("KeyName(%q) = %q, want %q", tc.in, got, tc.want)
		}
		checkValid(t, tc.in, got)
	}
}

func checkValid(t *testing.T, in, name string) {
	t.Helper()
	for _, k := range []string{ModelPrefix + name, ImagePrefix + name} {
		if errs := content.IsLabelKey(k); len(errs) > 0 {
			t.Fatalf("KeyName(%q) = %q: key %q is not a valid label key: %v", in, name, k, errs)
		}
		if !Owned(k) {
			t.Fatalf("key %q of %q is not owned", k, in)
		}
	}
}

// TestKeyNameForms checks the three forms stay apart: the property that
// makes the mapping injective apart from 80-bit hash collisions.
func TestKeyNameForms(t *testing.T) {
	inputs := []string{
		"a", "a-b", "a.b", "a_b", "a/b", "a-/b", "a/-b", "a/b/c", "a--b", "a..b",
		"a/b--c", "a--b/c", "a..b/c", "x", "a/b..c", "A/B", "a/B",
	}
	seen := map[string]string{}
	for _, in := range inputs {
		name := KeyName(in)
		checkValid(t, in, name)
		if other, ok := seen[name]; ok {
			t.Fatalf("KeyName(%q) = KeyName(%q) = %q", in, other, name)
		}
		seen[name] = in
		hashed := strings.Contains(name, hashMark)
		org := strings.Count(name, orgMark) == 1 && !hashed
		plain := name == in
		if n := btoi(hashed) + btoi(org) + btoi(plain); n != 1 {
			t.Errorf("KeyName(%q) = %q is in %d forms, want 1", in, name, n)
		}
		if org && strings.Replace(name, orgMark, "/", 1) != in {
			t.Errorf("KeyName(%q) = %q does not split back", in, name)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func FuzzKeyName(f *testing.F) {
	for _, s := range []string{"llama-3-8b", "meta/llama-3-8b", "a--b", "a..b", "", "ubuntu:22.04", strings.Repeat("z", 70), "\xff"} {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, kb := KeyName(a), KeyName(b)
		checkValid(t, a, ka)
		checkValid(t, b, kb)
		if a != b && ka == kb {
			t.Fatalf("KeyName(%q) = KeyName(%q) = %q", a, b, ka)
		}
		if KeyName(a) != ka {
			t.Fatalf("KeyName(%q) is not stable", a)
		}
	})
}
