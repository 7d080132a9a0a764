package daemon

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/spec"
)

func model(name, source string) spec.Spec {
	return spec.Spec{Kind: spec.KindModel, Name: name, Source: source}
}

func TestPlan(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	a := model("a", "s3://bkt/a/")
	a2 := model("a", "s3://bkt/a2/")
	b := model("b", "s3://bkt/b/")
	rec := func(s spec.Spec, state string, mod func(*cacheRecord)) cacheRecord {
		r := cacheRecord{Spec: s, State: state, CheckedAt: now.Add(-time.Minute)}
		if mod != nil {
			mod(&r)
		}
		return r
	}
	tests := []struct {
		name string
		w    world
		want []string
	}{
		{"new spec fetches", world{desired: []spec.Spec{a}}, []string{"fetch a"}},
		{"ready and checked recently: nothing", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateReady, nil)}, resync: time.Hour}, nil},
		{"ready but resync due", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateReady, nil)}, resync: 30 * time.Second}, []string{"fetch a"}},
		{"resync off", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateReady, nil)}}, nil},
		{"interrupted download resumes", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateDownloading, nil)}}, []string{"fetch a"}},
		{"running fetch left alone", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateDownloading, nil)}, running: map[string]spec.Spec{"a": a}}, nil},
		{"spec changed while running cancels", world{desired: []spec.Spec{a2}, running: map[string]spec.Spec{"a": a}}, []string{"cancel a"}},
		{"pin, priority or applier changed while running: left alone", world{desired: []spec.Spec{pinned(a)}, running: map[string]spec.Spec{"a": a}}, nil},
		{"pin changed when ready: recorded by a fetch", world{desired: []spec.Spec{pinned(a)}, records: map[string]cacheRecord{"a": rec(a, api.StateReady, nil)}, resync: time.Hour}, []string{"fetch a"}},
		{"evicted waits for backoff", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateEvicted, func(r *cacheRecord) { r.NextTry = now.Add(time.Second) })}}, nil},
		{"evicted tries again after backoff", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateEvicted, func(r *cacheRecord) { r.NextTry = now })}}, []string{"fetch a"}},
		{"insufficient space waits for backoff", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateInsufficientSpace, func(r *cacheRecord) { r.NextTry = now.Add(time.Second) })}}, nil},
		{"evicted and no longer desired is removed", world{records: map[string]cacheRecord{"a": rec(a, api.StateEvicted, nil)}}, []string{"remove a"}},
		{"spec changed when ready refetches", world{desired: []spec.Spec{a2}, records: map[string]cacheRecord{"a": rec(a, api.StateReady, nil)}}, []string{"fetch a"}},
		{"failed waits for backoff", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateFailed, func(r *cacheRecord) { r.NextTry = now.Add(time.Second) })}}, nil},
		{"failed retries after backoff", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateFailed, func(r *cacheRecord) { r.NextTry = now })}}, []string{"fetch a"}},
		{"ready with a failed re-check waits for backoff", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateReady, func(r *cacheRecord) { r.Error, r.NextTry = "S3 down", now.Add(time.Second) })}, resync: time.Hour}, nil},
		{"ready with a failed re-check retries after backoff", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateReady, func(r *cacheRecord) { r.Error, r.NextTry = "S3 down", now })}, resync: time.Hour}, []string{"fetch a"}},
		{"ready with a failed re-check waits for backoff, resync overdue", world{desired: []spec.Spec{a}, records: map[string]cacheRecord{"a": rec(a, api.StateReady, func(r *cacheRecord) { r.Error, r.NextTry = "S3 down", now.Add(time.Second) })}, resync: time.Second}, nil},
		{"undesired is removed", world{records: map[string]cacheRecord{"a": rec(a, api.StateReady, nil)}}, []string{"remove a"}},
		{"undesired running is removed", world{running: map[string]spec.Spec{"b": b}}, []string{"remove b"}},
		{"mixed, sorted", world{desired: []spec.Spec{b}, records: map[string]cacheRecord{"a": rec(a, api.StateReady, nil)}}, []string{"remove a", "fetch b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.w.now = now
			var got []string
			for _, act := range plan(tt.w) {
				got = append(got, fmt.Sprintf("%s %s", act.kind, act.name))
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("plan = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRetryDelay(t *testing.T) {
	want := []time.Duration{2 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	for i, w := range want {
		if got := retryDelay(i); got != w {
			t.Errorf("retryDelay(%d) = %v, want %v", i, got, w)
		}
	}
	if got := retryDelay(100); got != 5*time.Minute {
		t.Errorf("retryDelay(100) = %v, want 5m", got)
	}
}

func pinned(s spec.Spec) spec.Spec {
	s.Pin, s.Priority, s.AppliedBy = true, 5, "team-a"
	return s
}
