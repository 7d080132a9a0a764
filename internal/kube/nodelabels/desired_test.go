package nodelabels

import (
	"testing"
)

func TestDesired(t *testing.T) {
	got := Desired(State{
		Models:       map[string]string{"llama-3-8b": "r1-abc", "meta/llama-3-70b": "def"},
		Images:       map[string]string{"ghcr.io/acme/vllm:v1": "sha256:0123"},
		FailedModels: map[string]string{"broken": "403 from S3"},
	})
	wantLabels := map[string]string{
		"cache.warmfleet.io/llama-3-8b":                                                 "ready",
		"cache.warmfleet.io/meta--llama-3-70b":                                          "ready",
		"image.warmfleet.io/ghcr.io-acme-vllm-v1.." + hashOf(t, "ghcr.io/acme/vllm:v1"): "ready",
	}
	wantAnn := map[string]string{
		"cache.warmfleet.io/llama-3-8b":                                                 "r1-abc",
		"cache.warmfleet.io/meta--llama-3-70b":                                          "def",
		"image.warmfleet.io/ghcr.io-acme-vllm-v1.." + hashOf(t, "ghcr.io/acme/vllm:v1"): "sha256:0123",
	}
	equalMaps(t, "labels", got.Labels, wantLabels)
	equalMaps(t, "annotations", got.Annotations, wantAnn)
}

func hashOf(t *testing.T, s string) string {
	t.Helper()
	k := KeyName(s)
	return k[len(k)-hashLen:]
}

func equalMaps(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
		return
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s[%q] = %q (present %v), want %q", what, k, g, ok, v)
		}
	}
}

func TestPatch(t *testing.T) {
	want := Desired(State{Models: map[string]string{"a": "r2", "b": "r1"}})
	for _, tc := range []struct {
		name        string
		labels, ann map[string]string
		patch       string
	}{
		{
			name:  "empty node",
			patch: `{"metadata":{"labels":{"cache.warmfleet.io/a":"ready","cache.warmfleet.io/b":"ready"},"annotations":{"cache.warmfleet.io/a":"r2","cache.warmfleet.io/b":"r1"}}}`,
		},
		{
			name:   "up to date, others' keys ignored",
			labels: map[string]string{"cache.warmfleet.io/a": "ready", "cache.warmfleet.io/b": "ready", "gpu": "h100", "warmfleet.io/other": "x"},
			ann:    map[string]string{"cache.warmfleet.io/a": "r2", "cache.warmfleet.io/b": "r1", "node.alpha.kubernetes.io/ttl": "0"},
		},
		{
			name:   "new revision, gone cache, stale image",
			labels: map[string]string{"cache.warmfleet.io/a": "ready", "cache.warmfleet.io/b": "ready", "cache.warmfleet.io/gone": "ready", "image.warmfleet.io/old": "ready", "zone": "z1"},
			ann:    map[string]string{"cache.warmfleet.io/a": "r1", "cache.warmfleet.io/b": "r1", "cache.warmfleet.io/gone": "r9", "other": "keep"},
			patch:  `{"metadata":{"labels":{"cache.warmfleet.io/gone":null,"image.warmfleet.io/old":null},"annotations":{"cache.warmfleet.io/a":"r2","cache.warmfleet.io/gone":null}}}`,
		},
		{
			name:   "label value changed by hand",
			labels: map[string]string{"cache.warmfleet.io/a": "no", "cache.warmfleet.io/b": "ready"},
			ann:    map[string]string{"cache.warmfleet.io/a": "r2", "cache.warmfleet.io/b": "r1"},
			patch:  `{"metadata":{"labels":{"cache.warmfleet.io/a":"ready"}}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Patch(tc.labels, tc.ann, want)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.patch {
				t.Errorf("patch\n got %s\nwant %s", got, tc.patch)
			}
		})
	}
}
