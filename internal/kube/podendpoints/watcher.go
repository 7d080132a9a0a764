package podendpoints

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/warmfleet/warmfleet/internal/kube/retry"
)

// Pods is the part of the Pod API the watcher uses;
// clientset.CoreV1().Pods(namespace) has it ("" for all namespaces).
type Pods interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Config sets up a Watcher.
type Config struct {
	// NodeName is the daemon's own Node (NODE_NAME): only its pods are
	// listed and watched.
	NodeName string
	Pods     Pods
	Logger   *slog.Logger
	// Registerer, when set, gets the watcher's metrics.
	Registerer prometheus.Registerer
	// MinBackoff and MaxBackoff bound the wait after a failed list or
	// watch; it doubles from the first to the second. Zero means 1 s and
	// 5 min.
	MinBackoff, MaxBackoff time.Duration
	// Resync lists again this often even when the watch is healthy, so an
	// event lost anywhere between the API server and here is mended.
	// Zero means 10 min.
	Resync time.Duration
	// WatchTimeout is how long the API server keeps one watch open
	// (timeoutSeconds); a watch that ends resumes from the last version
	// seen. Zero means 5 min.
	WatchTimeout time.Duration
	// Timeout bounds each list. Zero means 30 s.
	Timeout time.Duration
}

// Watcher keeps the set of ready annotated pods on its node. Run does the
// API calls; Endpoints and Updates read the set.
type Watcher struct {
	cfg      Config
	log      *slog.Logger
	selector string

	pods     *prometheus.GaugeVec
	rejects  prometheus.Counter
	lists    *prometheus.CounterVec
	restarts *prometheus.CounterVec

	mu      sync.Mutex
	entries map[string]entry // namespace/name -> what the pod is
	synced  bool
	updates chan struct{}
}

type entry struct {
	st  State
	ep  Endpoint
	err string
}

// Results of a list, the values of warmfleet_pod_lists_total's result.
const (
	listOK        = "ok"
	listForbidden = "forbidden"
	listError     = "error"
)

// Why a watch ended, the values of warmfleet_pod_watch_restarts_total's reason.
const (
	restartClosed  = "closed"  // the server ended it (its timeout): resumed
	restartExpired = "expired" // 410 Gone: the version is too old; listed again
	restartError   = "error"   // the call failed or sent an error: backoff
	restartResync  = "resync"  // Resync elapsed: listed again
)

// errResync ends a watch for a periodic list.
var errResync = errors.New("resync")

// New checks the config and returns a Watcher; call Run to start it.
func New(cfg Config) (*Watcher, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("pod endpoints: node name is required (set NODE_NAME from the pod's spec.nodeName)")
	}
	if cfg.Pods == nil {
		return nil, errors.New("pod endpoints: no Pod client")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.MinBackoff = cmpOr(cfg.MinBackoff, time.Second)
	cfg.MaxBackoff = max(cmpOr(cfg.MaxBackoff, 5*time.Minute), cfg.MinBackoff)
	cfg.Resync = cmpOr(cfg.Resync, 10*time.Minute)
	cfg.WatchTimeout = cmpOr(cfg.WatchTimeout, 5*time.Minute)
	cfg.Timeout = cmpOr(cfg.Timeout, 30*time.Second)
	w := &Watcher{
		cfg: cfg, log: cfg.Logger, selector: "spec.nodeName=" + cfg.NodeName,
		entries: map[string]entry{}, updates: make(chan struct{}, 1),
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_pod_endpoints",
			Help: "Pods on this node annotated warmfleet.io/endpoint-port, by state: ready (an endpoint), not_ready, invalid (annotations that cannot make an endpoint).",
		}, []string{"state"}),
		rejects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmfleet_pod_endpoint_rejects_total",
			Help: "Times a pod's warmfleet.io annotations were found invalid (once per pod and value): the pod gets no endpoint.",
		}),
		lists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_pod_lists_total",
			Help: "Lists of this node's pods for endpoint discovery, by result: ok, forbidden, error.",
		}, []string{"result"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_pod_watch_restarts_total",
			Help: "Ends of the pod watch for endpoint discovery, by reason: closed (resumed), expired (listed again), error (after a backoff), resync (periodic list).",
		}, []string{"reason"}),
	}
	for _, s := range []State{Ready, NotReady, Invalid} {
		w.pods.WithLabelValues(string(s))
	}
	for _, r := range []string{listOK, listForbidden, listError} {
		w.lists.WithLabelValues(r)
	}
	for _, r := range []string{restartClosed, restartExpired, restartError, restartResync} {
		w.restarts.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{w.pods, w.rejects, w.lists, w.restarts} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("pod endpoints: metrics: %w", err)
			}
		}
	}
	return w, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Endpoints returns the ready pods' endpoints, sorted by URL, and whether
// a list has succeeded yet: before it, an empty set means "not known",
// and the caller must not remove what it registered earlier.
func (w *Watcher) Endpoints() ([]Endpoint, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.readyLocked(), w.synced
}

// Updates receives a value after the set of endpoints (or synced) changed;
// several changes may make one value.
func (w *Watcher) Updates() <-chan struct{} { return w.updates }

// Run lists this node's pods, then watches them from the list's version,
// until ctx ends; it returns nil then. A watch the server closes resumes
// from the last version seen; one whose version expired (410 Gone) lists
// again; a failed list or watch is logged, counted and retried after a
// backoff from MinBackoff to MaxBackoff. Every Resync it lists again.
func (w *Watcher) Run(ctx context.Context) error {
	failures := 0
	fail := func(what string, err error) bool {
		failures++
		d := retry.Backoff(w.cfg.MinBackoff, w.cfg.MaxBackoff, failures, rand.Float64())
		w.log.Warn("pod endpoints: "+what+" failed; retrying", "node", w.cfg.NodeName, "attempt", failures, "retry_in", d, "err", err)
		return sleep(ctx, d)
	}
	for {
		rv, err := w.list(ctx)
		if err != nil {
			if ctx.Err() != nil || !fail("list", err) {
				return nil
			}
			continue
		}
		if failures > 0 {
			w.log.Info("pod endpoints: listed after failures", "node", w.cfg.NodeName, "failures", failures)
		}
		failures = 0
		resync := time.NewTimer(w.cfg.Resync)
		for relist := false; !relist; {
			started := time.Now()
			n, err := w.watch(ctx, &rv, resync.C)
			switch {
			case ctx.Err() != nil:
				resync.Stop()
				return nil
			case errors.Is(err, errResync):
				w.restarts.WithLabelValues(restartResync).Inc()
				relist = true
			case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
				w.restarts.WithLabelValues(restartExpired).Inc()
				w.log.Info("pod endpoints: watch version expired; listing again", "err", err)
				relist = true
			case err == nil && (n > 0 || time.Since(started) >= w.cfg.MinBackoff):
				// The server's timeout, or a proxy's: resume where it ended.
				w.restarts.WithLabelValues(restartClosed).Inc()
				failures = 0
			default:
				// A failed call, an error event, or a watch the server closes
				// at once again and again: back off, then resume.
				w.restarts.WithLabelValues(restartError).Inc()
				if err == nil {
					err = errors.New("watch closed at once with no event")
				}
				if !fail("watch", err) {
					resync.Stop()
					return nil
				}
			}
		}
		resync.Stop()
	}
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// list replaces the set with the node's pods and returns the list's
// resource version, where the watch starts.
func (w *Watcher) list(ctx context.Context) (string, error) {
	lctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	l, err := w.cfg.Pods.List(lctx, metav1.ListOptions{FieldSelector: w.selector})
	if err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			w.lists.WithLabelValues(listForbidden).Inc()
		} else {
			w.lists.WithLabelValues(listError).Inc()
		}
		return "", fmt.Errorf("list pods (%s): %w", w.selector, err)
	}
	w.lists.WithLabelValues(listOK).Inc()
	w.mu.Lock()
	defer w.mu.Unlock()
	before := w.readyLocked()
	old := w.entries
	w.entries = map[string]entry{}
	for i := range l.Items {
		w.putLocked(&l.Items[i], old)
	}
	w.finishLocked(before, !w.synced)
	w.synced = true
	return l.ResourceVersion, nil
}

// watch follows the node's pods from *rv, which it advances, until the
// watch ends, ctx ends or resync fires; it returns how many events it
// applied. An error event comes back as the API error it holds.
func (w *Watcher) watch(ctx context.Context, rv *string, resync <-chan time.Time) (int, error) {
	secs := int64(w.cfg.WatchTimeout / time.Second)
	wi, err := w.cfg.Pods.Watch(ctx, metav1.ListOptions{FieldSelector: w.selector, ResourceVersion: *rv,
		AllowWatchBookmarks: true, TimeoutSeconds: &secs})
	if err != nil {
		return 0, fmt.Errorf("watch pods (%s) from version %q: %w", w.selector, *rv, err)
	}
	defer wi.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-resync:
			return n, errResync
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return n, nil
			}
			switch ev.Type {
			case watch.Error:
				return n, fmt.Errorf("watch pods: %w", apierrors.FromObject(ev.Object))
			case watch.Bookmark:
				if m, err := meta.Accessor(ev.Object); err == nil && m.GetResourceVersion() != "" {
					*rv = m.GetResourceVersion()
				}
			case watch.Added, watch.Modified, watch.Deleted:
				pod, ok := ev.Object.(*corev1.Pod)
				if !ok {
					return n, fmt.Errorf("watch pods: a %s event holds a %T, not a Pod", ev.Type, ev.Object)
				}
				if pod.ResourceVersion != "" {
					*rv = pod.ResourceVersion
				}
				w.event(pod, ev.Type == watch.Deleted)
				n++
			}
		}
	}
}

func (w *Watcher) event(pod *corev1.Pod, deleted bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	before := w.readyLocked()
	if deleted {
		delete(w.entries, key(pod))
	} else {
		w.putLocked(pod, w.entries)
	}
	w.finishLocked(before, false)
}

func key(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// putLocked records what pod is, given what it was in prev (for logging
// and counting an invalid annotation once per value).
func (w *Watcher) putLocked(pod *corev1.Pod, prev map[string]entry) {
	k := key(pod)
	ep, st, ok, err := FromPod(pod, w.cfg.NodeName)
	if !ok {
		delete(w.entries, k)
		return
	}
	e := entry{st: st, ep: ep}
	if err != nil {
		e.err = err.Error()
		if old := prev[k]; old.st != Invalid || old.err != e.err {
			w.rejects.Inc()
			w.log.Warn("pod endpoints: pod not registered: bad annotation", "err", err)
		}
	}
	w.entries[k] = e
}

func (w *Watcher) readyLocked() []Endpoint {
	var out []Endpoint
	for _, e := range w.entries {
		if e.st == Ready {
			out = append(out, e.ep)
		}
	}
	slices.SortFunc(out, func(a, b Endpoint) int {
		return cmp.Or(strings.Compare(a.URL, b.URL), strings.Compare(a.Pod, b.Pod))
	})
	return out
}

// finishLocked updates the gauges and signals Updates when the ready set
// differs from before (or force).
func (w *Watcher) finishLocked(before []Endpoint, force bool) {
	counts := map[State]int{}
	for _, e := range w.entries {
		counts[e.st]++
	}
	for _, s := range []State{Ready, NotReady, Invalid} {
		w.pods.WithLabelValues(string(s)).Set(float64(counts[s]))
	}
	if force || !slices.Equal(before, w.readyLocked()) {
		select {
		case w.updates <- struct{}{}:
		default:
		}
	}
}
