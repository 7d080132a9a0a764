package spec

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want string // substring of the error; "" means valid
	}{
		{"model", Spec{Kind: KindModel, Name: "llama-3-8b", Source: "s3://models/llama/"}, ""},
		{"org model", Spec{Kind: KindModel, Name: "meta/llama", Source: "s3://models/llama", Revision: "v1"}, ""},
		{"model selector", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Targets: Targets{Selector: map[string]string{"gpu": "h100"}, Nodes: 3}}, ""},
		{"image", Spec{Kind: KindImage, Name: "registry.local:5000/vllm/vllm:v0.6@sha256:abc", Owner: "team-a/deploy"}, ""},
		{"no kind", Spec{Name: "m"}, "kind"},
		{"traversal name", Spec{Kind: KindModel, Name: "../x", Source: "s3://bkt/p/"}, "model name"},
		{"double dash", Spec{Kind: KindModel, Name: "a--b", Source: "s3://bkt/p/"}, "model name"},
		{"three segments", Spec{Kind: KindModel, Name: "a/b/c", Source: "s3://bkt/p/"}, "model name"},
		{"no source", Spec{Kind: KindModel, Name: "m"}, "source is required"},
		{"bad source", Spec{Kind: KindModel, Name: "m", Source: "http://x/y"}, "s3://"},
		{"bad revision", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Revision: "../r"}, "revision"},
		{"model owner", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Owner: "x"}, "owner"},
		{"image no owner", Spec{Kind: KindImage, Name: "nginx:1"}, "owner"},
		{"image upper", Spec{Kind: KindImage, Name: "Nginx", Owner: "o"}, "image reference"},
		{"negative nodes", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Targets: Targets{Nodes: -1}}, "nodes"},
		{"bad label", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Targets: Targets{Selector: map[string]string{"a b": "c"}}}, "label key"},
		{"hub model", Spec{Kind: KindModel, Name: "m", Source: "hf://org/model@v1.0/sub", Include: []string{"*.safetensors", "onnx/*"}, Exclude: []string{"*.bin"}}, ""},
		{"bad hub source", Spec{Kind: KindModel, Name: "m", Source: "hf://org"}, "Hub id"},
		{"bad include", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Include: []string{"[a-"}}, "include pattern"},
		{"empty exclude", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Exclude: []string{""}}, "exclude pattern"},
		{"multiline pattern", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Include: []string{"a\nb"}}, "include pattern"},
		{"too many patterns", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Include: make([]string, MaxPatterns+1)}, "at most 32"},
		{"long pattern", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Include: []string{strings.Repeat("a", MaxPatternBytes+1)}}, "include pattern"},
		{"image include", Spec{Kind: KindImage, Name: "nginx:1", Owner: "o", Include: []string{"*"}}, "models only"},
		{"pinned, prioritized, applied", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Pin: true, Priority: -MaxPriority, AppliedBy: "file:/etc/caches.yaml"}, ""},
		{"priority too high", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Priority: MaxPriority + 1}, "priority 1001"},
		{"pinned image", Spec{Kind: KindImage, Name: "nginx:1", Owner: "o", Pin: true}, "apply to models only"},
		{"applier with a newline", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", AppliedBy: "a\nb"}, "printable"},
		{"applier too long", Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", AppliedBy: strings.Repeat("o", MaxAppliedByLen+1)}, "printable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.want)
			}
		})
	}
}

func TestKeyAndEqual(t *testing.T) {
	a := Spec{Kind: KindImage, Name: "nginx:1", Owner: "a"}
	b := Spec{Kind: KindImage, Name: "nginx:1", Owner: "b"}
	if a.Key() == b.Key() {
		t.Fatal("owners of one image must have distinct keys")
	}
	m := Spec{Kind: KindModel, Name: "m", Source: "s3://bkt/p/", Targets: Targets{Selector: map[string]string{"a": "1"}}}
	m2 := m
	m2.Targets.Selector = map[string]string{"a": "2"}
	if !m.Equal(m) || m.Equal(m2) {
		t.Fatal("Equal must compare selectors")
	}
	// A change of pin, priority or applier is a write the fleet must see.
	for _, change := range []func(*Spec){func(s *Spec) { s.Pin = true }, func(s *Spec) { s.Priority = 1 }, func(s *Spec) { s.AppliedBy = "o" }} {
		m3 := m
		change(&m3)
		if m.Equal(m3) {
			t.Fatalf("Equal misses a change: %+v", m3)
		}
	}
	if m.Key() != "model/m" {
		t.Fatalf("Key = %q", m.Key())
	}
}

func TestParseS3URL(t *testing.T) {
	tests := []struct {
		in, bucket, prefix string
		ok                 bool
	}{
		{"s3://models/llama/", "models", "llama/", true},
		{"s3://models/llama", "models", "llama/", true},
		{"s3://models", "models", "", true},
		{"s3://models/", "models", "", true},
		{"s3://my.bucket-1/a/b/c/", "my.bucket-1", "a/b/c/", true},
		{"http://models/llama/", "", "", false},
		{"s3://", "", "", false},
		{"s3://UPPER/x", "", "", false},
		{"s3://ab/x", "", "", false},
		{"s3://models//x", "", "", false},
		{"s3://models/../x", "", "", false},
		{"s3://models/a\x00b", "", "", false},
		{"s3://a..b/x", "", "", false},
	}
	for _, tt := range tests {
		u, err := ParseS3URL(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ParseS3URL(%q) = %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && (u.Bucket != tt.bucket || u.Prefix != tt.prefix) {
			t.Errorf("ParseS3URL(%q) = %+v, want %s %s", tt.in, u, tt.bucket, tt.prefix)
		}
	}
}

func FuzzParseS3URL(f *testing.F) {
	for _, s := range []string{"s3://models/llama/", "s3://b/../x", "s3://bkt", "s3:///x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		u, err := ParseS3URL(in)
		if err != nil {
			return
		}
		again, err := ParseS3URL(u.String())
		if err != nil || again != u {
			t.Fatalf("round trip of %q: %+v, %v (first %+v)", in, again, err, u)
		}
		if u.Prefix != "" && !strings.HasSuffix(u.Prefix, "/") {
			t.Fatalf("prefix %q does not end in /", u.Prefix)
		}
	})
}

func TestParseLabels(t *testing.T) {
	got, err := ParseLabels([]string{"gpu=h100", "zone=us-east-1a", "empty="})
	if err != nil || got["gpu"] != "h100" || got["zone"] != "us-east-1a" || got["empty"] != "" {
		t.Fatalf("ParseLabels = %v, %v", got, err)
	}
	for _, bad := range []string{"novalue", "=x", "a=b c", "k=" + strings.Repeat("v", 64)} {
		if _, err := ParseLabels([]string{bad}); err == nil {
			t.Errorf("ParseLabels(%q) accepted", bad)
		}
	}
}

func TestKeeps(t *testing.T) {
	s := Spec{Include: []string{"*.safetensors", "onnx/*", "config.json"}, Exclude: []string{"*-fp32.*", "onnx/big.onnx"}}
	for rel, want := range map[string]bool{
		"model.safetensors":      true,
		"sub/model.safetensors":  true, // no '/': the base name
		"model-fp32.safetensors": false,
		"onnx/model.onnx":        true,
		"onnx/big.onnx":          false,
		"deep/onnx/model.onnx":   false, // with '/': the whole path
		"config.json":            true,
		"tokenizer.json":         false,
		"README.md":              false,
	} {
		if got := s.Keeps(rel); got != want {
			t.Errorf("Keeps(%q) = %v, want %v", rel, got, want)
		}
	}
	if !(Spec{}).Keeps("anything/at/all") {
		t.Error("a spec without patterns drops a file")
	}
	if (Spec{Include: []string{"*.json"}}).Equal(Spec{}) || !(Spec{Exclude: []string{"a"}}).Equal(Spec{Exclude: []string{"a"}}) {
		t.Error("Equal ignores the patterns")
	}
}
