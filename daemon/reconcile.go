package daemon

import (
	"cmp"
	"slices"
	"sort"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/spec"
)

type actionKind int

const (
	// actFetch lists the source and downloads, resumes or re-checks a cache.
	actFetch actionKind = iota
	// actCancel stops a fetch whose spec changed; the next round starts anew.
	actCancel
	// actRemove stops any fetch and deletes the cache from disk and state.
	actRemove
)

func (k actionKind) String() string {
	return [...]string{"fetch", "cancel", "remove"}[k]
}

type action struct {
	kind actionKind
	name string
	spec spec.Spec
}

// world is what the reconcile decision looks at; plan is free of IO so every
// rule is a table test.
type world struct {
	// desired holds the model specs that target this node.
	desired []spec.Spec
	records map[string]cacheRecord
	// running maps a model name to the spec its in-flight fetch works on.
	running map[string]spec.Spec
	now     time.Time
	// resync is how often a ready cache re-lists its source to notice
	// changed objects; zero turns it off.
	resync time.Duration
}

// plan decides what to do to move the node toward its desired caches.
func plan(w world) []action {
	var acts []action
	want := make(map[string]bool, len(w.desired))
	for _, d := range w.desired {
		want[d.Name] = true
		if run, ok := w.running[d.Name]; ok {
			if !sameFetch(run, d) {
				acts = append(acts, action{kind: actCancel, name: d.Name, spec: run})
			}
			continue
		}
		rec, ok := w.records[d.Name]
		if needsFetch(rec, ok, d, w.now, w.resync) {
			acts = append(acts, action{kind: actFetch, name: d.Name, spec: d})
		}
	}
	for name, rec := range w.records {
		if !want[name] {
			acts = append(acts, action{kind: actRemove, name: name, spec: rec.Spec})
		}
	}
	for name, run := range w.running {
		if _, ok := w.records[name]; !ok && !want[name] {
			acts = append(acts, action{kind: actRemove, name: name, spec: run})
		}
	}
	sort.Slice(acts, func(i, j int) bool {
		if acts[i].name != acts[j].name {
			return acts[i].name < acts[j].name
		}
		return acts[i].kind < acts[j].kind
	})
	return acts
}

// sameFetch reports whether a running fetch still does what spec d asks:
// the capacity settings and the applier do not change what it fetches, so
// a change of them waits for the fetch to end rather than restart it.
func sameFetch(run, d spec.Spec) bool {
	for _, s := range []*spec.Spec{&run, &d} {
		s.Pin, s.Priority, s.AppliedBy = false, 0, ""
	}
	return run.Equal(d)
}

func needsFetch(rec cacheRecord, found bool, d spec.Spec, now time.Time, resync time.Duration) bool {
	switch {
	case !found, !rec.Spec.Equal(d):
		return true
	case rec.State == api.StateFailed, rec.State == api.StateInsufficientSpace, rec.State == api.StateEvicted:
		return !now.Before(rec.NextTry)
	case rec.State == api.StateReady && rec.Error != "":
		// A failed re-check or update is retried after its backoff, also
		// when the resync is overdue (the failure left CheckedAt behind).
		return !now.Before(rec.NextTry)
	case rec.State == api.StateReady:
		return resync > 0 && now.Sub(rec.CheckedAt) >= resync
	default: // pending, downloading or verifying with no fetch running: resume after a restart
		return true
	}
}

// retryDelay is the backoff after the n-th failed attempt in a row: 2s
// doubling to at most 5 minutes, so a broken source is retried without
// hammering S3.
func retryDelay(attempts int) time.Duration {
	d := 2 * time.Second
	for i := 1; i < attempts && d < 5*time.Minute; i++ {
		d *= 2
	}
	return min(d, 5*time.Minute)
}

// retiredRevision is a published revision that is no longer its model's
// current one. It stays on disk for a grace period, since an inference
// server may be part way through opening its shards.
type retiredRevision struct {
	Model, Revision string
	RetiredAt       time.Time
	// Bytes is the space it takes on disk (measured when retired).
	Bytes int64
}

// pickPrunes decides which retired revisions to delete now: every one whose
// grace has passed and, when a download is short bytes of space, more of
// them, oldest retired first, until their bytes cover it. When all of them
// together cannot cover it, none is taken early: the download fails either
// way, so readers keep their files.
func pickPrunes(old []retiredRevision, now time.Time, grace time.Duration, short int64) []retiredRevision {
	sorted := slices.Clone(old)
	slices.SortFunc(sorted, func(a, b retiredRevision) int {
		return cmp.Or(a.RetiredAt.Compare(b.RetiredAt), cmp.Compare(a.Model, b.Model), cmp.Compare(a.Revision, b.Revision))
	})
	var picked, kept []retiredRevision
	var freed, keptBytes int64
	for _, r := range sorted {
		if !now.Before(r.RetiredAt.Add(grace)) {
			picked = append(picked, r)
			freed += max(0, r.Bytes)
		} else {
			kept = append(kept, r)
			keptBytes += max(0, r.Bytes)
		}
	}
	if short <= freed || short > freed+keptBytes {
		return picked
	}
	for _, r := range kept {
		if freed >= short {
			break
		}
		picked = append(picked, r)
		freed += max(0, r.Bytes)
	}
	return picked
}
