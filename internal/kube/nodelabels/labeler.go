package nodelabels

import (
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/warmfleet/warmfleet/internal/kube/retry"
)

// Nodes is the part of the Node API the labeler uses;
// clientset.CoreV1().Nodes() has it.
type Nodes interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error)
}

// Events is where the labeler records Events; clientset.CoreV1().Events(EventNamespace) has it.
type Events interface {
	Create(ctx context.Context, ev *corev1.Event, opts metav1.CreateOptions) (*corev1.Event, error)
}

// EventNamespace holds Events about Nodes, which have no namespace of their
// own (the kubelet uses it too).
const EventNamespace = metav1.NamespaceDefault

// Event reasons.
const (
	ReasonModelReady  = "ModelCacheReady"
	ReasonModelFailed = "ModelCacheFailed"
	ReasonImageReady  = "ImageReady"
	ReasonImageFailed = "ImageFailed"
)

// Config sets up a Labeler.
type Config struct {
	// NodeName is the Node to label: the daemon's own (NODE_NAME).
	NodeName string
	Nodes    Nodes
	// Events, when set, receives an Event on the Node each time an item
	// becomes ready or fails (not for the first State: a restarted daemon
	// does not announce again what was ready before). Events are best effort: one
	// try each, never retried.
	Events Events
	Logger *slog.Logger
	// Registerer, when set, gets the labeler's metrics.
	Registerer prometheus.Registerer
	// MinBackoff and MaxBackoff bound the wait after a failed sync; it
	// doubles from the first to the second. Zero means 1 s and 5 min.
	MinBackoff, MaxBackoff time.Duration
	// Resync re-checks the Node this often even without news, so a label
	// someone removed by hand comes back. Zero means 10 min.
	Resync time.Duration
	// Timeout bounds each API call. Zero means 30 s.
	Timeout time.Duration
	// Now stamps Events; nil means time.Now.
	Now func() time.Time
}

// Labeler keeps the Node's warmfleet labels in step with the latest State.
// Update never blocks; Run does the API calls.
type Labeler struct {
	cfg   Config
	log   *slog.Logger
	syncs *prometheus.CounterVec
	// events counts Events sent, to name them apart; Run's goroutine only.
	events int

	mu      sync.Mutex
	latest  State
	hasNews bool
	news    chan struct{}
}

// Sync results, the values of the result label of warmfleet_node_label_syncs_total.
const (
	resultPatched   = "patched"
	resultUnchanged = "unchanged"
	resultForbidden = "forbidden"
	resultNotFound  = "not_found"
	resultError     = "error"
)

// New checks the config and returns a Labeler; call Run to start it.
func New(cfg Config) (*Labeler, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("node labels: node name is required (set NODE_NAME from the pod's spec.nodeName)")
	}
	if cfg.Nodes == nil {
		return nil, errors.New("node labels: no Node client")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Minute
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &Labeler{
		cfg: cfg, log: cfg.Logger, news: make(chan struct{}, 1),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_node_label_syncs_total",
			Help: "Attempts to bring the Node's warmfleet labels up to date, by result: patched, unchanged, forbidden, not_found, error.",
		}, []string{"result"}),
	}
	for _, r := range []string{resultPatched, resultUnchanged, resultForbidden, resultNotFound, resultError} {
		l.syncs.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(l.syncs); err != nil {
			return nil, fmt.Errorf("node labels: metrics: %w", err)
		}
	}
	return l, nil
}

// Update hands the labeler the node's current state. It never blocks: a
// state not yet applied is replaced by a newer one.
func (l *Labeler) Update(s State) {
	s = s.clone()
	l.mu.Lock()
	l.latest, l.hasNews = s, true
	l.mu.Unlock()
	select {
	case l.news <- struct{}{}:
	default:
	}
}

func (l *Labeler) take() (State, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.latest, l.hasNews
	l.hasNews = false
	return s, ok
}

// Run applies states until ctx ends; it returns nil then. It syncs once the
// first state arrives (a daemon that has nothing ready also clears stale
// labels by sending an empty State), after each Update, every Resync, and
// after a failure once its backoff has passed. States that arrive during a
// backoff wait for it: a cluster refusing us is not asked more often.
func (l *Labeler) Run(ctx context.Context) error {
	var (
		cur      State
		started  bool
		failures int
		timer    *time.Timer
		timerC   <-chan time.Time
	)
	resetTimer := func(d time.Duration) {
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		timerC = timer.C
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.news:
			if failures > 0 {
				continue // the backoff timer picks the news up
			}
		case <-timerC:
		}
		if s, ok := l.take(); ok {
			if started {
				l.recordEvents(ctx, cur, s)
			}
			cur, started = s, true
		}
		if !started {
			continue
		}
		if err := l.sync(ctx, cur); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			failures++
			d := retry.Backoff(l.cfg.MinBackoff, l.cfg.MaxBackoff, failures, rand.Float64())
			l.log.Warn("node labels: sync failed; retrying", "node", l.cfg.NodeName, "attempt", failures, "retry_in", d, "err", err)
			resetTimer(d)
			continue
		}
		if failures > 0 {
			l.log.Info("node labels: synced after failures", "node", l.cfg.NodeName, "failures", failures)
		}
		failures = 0
		resetTimer(l.cfg.Resync)
	}
}

// sync brings the Node's owned labels and annotations to what s wants.
func (l *Labeler) sync(ctx context.Context, s State) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	node, err := l.cfg.Nodes.Get(ctx, l.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		l.count(err)
		return fmt.Errorf("get node %s: %w", l.cfg.NodeName, err)
	}
	patch, err := Patch(node.Labels, node.Annotations, Desired(s))
	if err != nil {
		l.count(err)
		return err
	}
	if patch == nil {
		l.syncs.WithLabelValues(resultUnchanged).Inc()
		return nil
	}
	if _, err := l.cfg.Nodes.Patch(ctx, l.cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
		l.count(err)
		return fmt.Errorf("patch node %s: %w", l.cfg.NodeName, err)
	}
	l.syncs.WithLabelValues(resultPatched).Inc()
	return nil
}

// FieldManager names warmfleet in the Node's managedFields.
const FieldManager = "warmfleet"

func (l *Labeler) count(err error) {
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		l.syncs.WithLabelValues(resultForbidden).Inc()
	case apierrors.IsNotFound(err):
		l.syncs.WithLabelValues(resultNotFound).Inc()
	default:
		l.syncs.WithLabelValues(resultError).Inc()
	}
}

// recordEvents sends an Event for each item ready in next but not (at that
// revision) in prev, and for each item that newly failed.
func (l *Labeler) recordEvents(ctx context.Context, prev, next State) {
	if l.cfg.Events == nil {
		return
	}
	for _, name := range news(prev.Models, next.Models) {
		l.event(ctx, corev1.EventTypeNormal, ReasonModelReady,
			fmt.Sprintf("model cache %s is ready at revision %s (label %s)", name, next.Models[name], ModelKey(name)))
	}
	for _, ref := range news(prev.Images, next.Images) {
		l.event(ctx, corev1.EventTypeNormal, ReasonImageReady,
			fmt.Sprintf("image %s is ready at %s (label %s)", ref, next.Images[ref], ImageKey(ref)))
	}
	for _, name := range news(prev.FailedModels, next.FailedModels) {
		l.event(ctx, corev1.EventTypeWarning, ReasonModelFailed, fmt.Sprintf("model cache %s failed: %s", name, next.FailedModels[name]))
	}
	for _, ref := range news(prev.FailedImages, next.FailedImages) {
		l.event(ctx, corev1.EventTypeWarning, ReasonImageFailed, fmt.Sprintf("image %s failed: %s", ref, next.FailedImages[ref]))
	}
}

// news lists, sorted, the keys of next that prev lacks or holds with
// another value.
func news(prev, next map[string]string) []string {
	var out []string
	for k, v := range next {
		if old, ok := prev[k]; !ok || old != v {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// maxMessage keeps an Event under the API server's 1 KiB message limit.
const maxMessage = 1024

func (l *Labeler) event(ctx context.Context, typ, reason, msg string) {
	if len(msg) > maxMessage {
		msg = strings.ToValidUTF8(msg[:maxMessage-3], "") + "..."
	}
	t := l.cfg.Now()
	now := metav1.NewTime(t)
	l.events++
	ev := &corev1.Event{
		// Named like the kubelet's Events, plus a count for Events of one instant.
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x.%d", l.cfg.NodeName, t.UnixNano(), l.events), Namespace: EventNamespace},
		// The kubelet names its Node as the UID too; Events need no lookup.
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: l.cfg.NodeName, UID: types.UID(l.cfg.NodeName)},
		Reason:         reason, Message: msg, Type: typ,
		Source:         corev1.EventSource{Component: FieldManager, Host: l.cfg.NodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "warmfleet.io/daemon", ReportingInstance: l.cfg.NodeName,
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	if _, err := l.cfg.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		l.log.Debug("node labels: event not recorded", "reason", reason, "err", err)
	}
}
