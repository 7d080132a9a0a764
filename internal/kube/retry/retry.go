// Package retry holds the backoff the Kubernetes parts of the daemon (the
// node labeler, the pod watcher) wait after a failed call: doubling, capped,
// with jitter, so the daemons of a fleet refused at once (RBAC not bound
// yet, an API server restart) do not all come back at once.
package retry

import "time"

// Backoff is the wait after the n-th failure in a row (n >= 1): lo doubled
// n-1 times, at most hi, of which a random part u*half (u in [0,1)) is
// taken off.
func Backoff(lo, hi time.Duration, n int, u float64) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d - time.Duration(u*float64(d/2))
}
