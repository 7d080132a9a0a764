package spec

import "testing"

func TestParseHFURL(t *testing.T) {
	good := map[string]HFURL{
		"hf://meta-llama/Llama-3.1-8B": {Repo: "meta-llama/Llama-3.1-8B", Revision: "main"},
		"hf://org/model@v1.0":          {Repo: "org/model", Revision: "v1.0"},
		"hf://org/model@0123456789abcdef0123456789abcdef01234567/onnx/": {Repo: "org/model", Revision: "0123456789abcdef0123456789abcdef01234567", Subdir: "onnx"},
		"hf://org/model/a/b": {Repo: "org/model", Revision: "main", Subdir: "a/b"},
	}
	for in, want := range good {
		got, err := ParseHFURL(in)
		if err != nil || got != want {
			t.Errorf("ParseHFURL(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if again, err := ParseHFURL(got.String()); err != nil || again != got {
			t.Errorf("round trip of %q through %q = %+v, %v", in, got.String(), again, err)
		}
	}
	for _, in := range []string{
		"s3://b/p", "hf://", "hf://model", "hf://org/", "hf://../x", "hf://org/..", "hf://org/m@",
		"hf://org/m@-x", "hf://org/m/../etc", "hf://org/m//x", "hf://org/m/a/./b", "hf://org/m/a\\b",
		"hf://org/m/a?x", "hf://o rg/m", "hf://org/m/\x01",
	} {
		if got, err := ParseHFURL(in); err == nil {
			t.Errorf("ParseHFURL(%q) = %+v, want an error", in, got)
		}
	}
}
