package nodelabels

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/warmfleet/warmfleet/internal/testutil/bg"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const node = "gpu-1"

func newNode(labels, ann map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: labels, Annotations: ann}}
}

// start runs a Labeler on cs inside the current synctest bubble and stops
// it when the test ends.
func start(t *testing.T, cs *fake.Clientset, mod func(*Config)) *Labeler {
	t.Helper()
	cfg := Config{NodeName: node, Nodes: cs.CoreV1().Nodes(), MinBackoff: time.Second, MaxBackoff: time.Minute, Resync: time.Hour}
	if mod != nil {
		mod(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bg.Run(t, l.Run)
	return l
}

func getNode(t *testing.T, cs *fake.Clientset) *corev1.Node {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func count(t *testing.T, l *Labeler, result string) int {
	t.Helper()
	var m dto.Metric
	if err := l.syncs.WithLabelValues(result).Write(&m); err != nil {
		t.Fatal(err)
	}
	return int(m.GetCounter().GetValue())
}

func forbidden() error {
	return apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, node, errors.New(`User "system:serviceaccount:warmfleet:warmfleet" cannot patch resource "nodes"`))
}

func TestLabelerKeepsOthersKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newNode(
			map[string]string{"gpu": "h100", "kubernetes.io/hostname": node, ModelKey("stale"): ReadyValue},
			map[string]string{"node.alpha.kubernetes.io/ttl": "0", ModelKey("stale"): "r0"}))
		// Another controller labels the node between our Get and our Patch:
		// the patch must not undo it.
		var once sync.Once
		cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			// The fake holds its lock while reacting: go to the tracker.
			once.Do(func() {
				gvr := corev1.SchemeGroupVersion.WithResource("nodes")
				obj, err := cs.Tracker().Get(gvr, "", node)
				if err != nil {
					t.Error(err)
					return
				}
				n := obj.(*corev1.Node)
				n.Labels["team"] = "infer"
				if err := cs.Tracker().Update(gvr, n, ""); err != nil {
					t.Error(err)
				}
			})
			return false, nil, nil
		})
		l := start(t, cs, nil)

		l.Update(State{Models: map[string]string{"meta/llama-3-8b": "r1"}, Images: map[string]string{"ghcr.io/acme/vllm:v1": "sha256:aa"}})
		synctest.Wait()
		n := getNode(t, cs)
		equalMaps(t, "labels", n.Labels, map[string]string{
			"gpu": "h100", "kubernetes.io/hostname": node, "team": "infer",
			"cache.warmfleet.io/meta--llama-3-8b": "ready", ImageKey("ghcr.io/acme/vllm:v1"): "ready",
		})
		equalMaps(t, "annotations", n.Annotations, map[string]string{
			"node.alpha.kubernetes.io/ttl":        "0",
			"cache.warmfleet.io/meta--llama-3-8b": "r1", ImageKey("ghcr.io/acme/vllm:v1"): "sha256:aa",
		})

		// A new revision not yet ready here, and the image gone: both go.
		l.Update(State{})
		synctest.Wait()
		n = getNode(t, cs)
		equalMaps(t, "labels", n.Labels, map[string]string{"gpu": "h100", "kubernetes.io/hostname": node, "team": "infer"})
		equalMaps(t, "annotations", n.Annotations, map[string]string{"node.alpha.kubernetes.io/ttl": "0"})
		if got := count(t, l, resultPatched); got != 2 {
			t.Errorf("patched %d times, want 2", got)
		}

		// The same state again costs a Get and no Patch.
		before := len(cs.Actions())
		l.Update(State{})
		synctest.Wait()
		if acts := cs.Actions()[before:]; len(acts) != 1 || acts[0].GetVerb() != "get" {
			t.Errorf("unchanged state made calls %v, want one get", acts)
		}
	})
}

func TestLabelerForbiddenBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newNode(map[string]string{"gpu": "h100"}, nil))
		var (
			mu  sync.Mutex
			ats []time.Time
		)
		attempts := func() []time.Time { mu.Lock(); defer mu.Unlock(); return slices.Clone(ats) }
		cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			ats = append(ats, time.Now())
			if len(ats) <= 4 {
				return true, nil, forbidden()
			}
			return false, nil, nil
		})
		l := start(t, cs, nil)
		t0 := time.Now()
		l.Update(State{Models: map[string]string{"a": "r1"}})
		synctest.Wait()
		if n := len(attempts()); n != 1 {
			t.Fatalf("%d attempts before any backoff, want 1", n)
		}
		// Updates during the backoff return at once (a blocked Update would
		// deadlock the bubble) and the latest one wins.
		for i := range 1000 {
			l.Update(State{Models: map[string]string{"a": "r1", "b": string(rune('a' + i%26))}})
		}
		l.Update(State{Models: map[string]string{"a": "r2", "b": "last"}})
		synctest.Wait()
		if n := len(attempts()); n != 1 {
			t.Fatalf("updates during backoff caused %d attempts, want 1", n)
		}
		time.Sleep(10 * time.Minute)
		all := attempts()
		if len(all) != 5 {
			t.Fatalf("%d attempts, want 5", len(all))
		}
		// Waits double from 1 s, each with up to half taken off.
		prev := t0
		for i, at := range all[1:] {
			gap, d := at.Sub(prev), time.Second<<i
			if gap < d/2 || gap > d {
				t.Errorf("wait before attempt %d = %v, want in [%v, %v]", i+2, gap, d/2, d)
			}
			prev = at
		}
		if got := count(t, l, resultForbidden); got != 4 {
			t.Errorf("forbidden counted %d times, want 4", got)
		}
		n := getNode(t, cs)
		equalMaps(t, "labels", n.Labels, map[string]string{"gpu": "h100", ModelKey("a"): "ready", ModelKey("b"): "ready"})
		equalMaps(t, "annotations", n.Annotations, map[string]string{ModelKey("a"): "r2", ModelKey("b"): "last"})
	})
}

func TestLabelerNodeNotFound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		l := start(t, cs, nil)
		l.Update(State{Models: map[string]string{"a": "r1"}})
		time.Sleep(time.Second)
		synctest.Wait()
		if got := count(t, l, resultNotFound); got < 1 {
			t.Fatalf("not_found counted %d times, want >= 1", got)
		}
		// The kubelet registers the Node later: the labeler gets there.
		if err := cs.Tracker().Add(newNode(map[string]string{"gpu": "h100"}, nil)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		equalMaps(t, "labels", getNode(t, cs).Labels, map[string]string{"gpu": "h100", ModelKey("a"): "ready"})
	})
}

func TestLabelerResync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newNode(nil, nil))
		l := start(t, cs, nil)
		l.Update(State{Models: map[string]string{"a": "r1"}})
		synctest.Wait()
		n := getNode(t, cs)
		delete(n.Labels, ModelKey("a"))
		if _, err := cs.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour + time.Second)
		equalMaps(t, "labels", getNode(t, cs).Labels, map[string]string{ModelKey("a"): "ready"})
	})
}

func TestLabelerEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newNode(nil, nil))
		l := start(t, cs, func(c *Config) { c.Events = cs.CoreV1().Events(EventNamespace) })
		l.Update(State{Models: map[string]string{"old": "r1"}})
		synctest.Wait()
		l.Update(State{
			Models:       map[string]string{"old": "r1", "new": "r7"},
			Images:       map[string]string{"ubuntu:24.04": "sha256:bb"},
			FailedModels: map[string]string{"bad": "s3: 403 Forbidden"},
		})
		synctest.Wait()
		evs, err := cs.CoreV1().Events(EventNamespace).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != node {
				t.Errorf("event %s is about %v", ev.Name, ev.InvolvedObject)
			}
			got[ev.Reason+"/"+ev.Type] = ev.Message
		}
		equalMaps(t, "events", got, map[string]string{
			ReasonModelReady + "/Normal":   "model cache new is ready at revision r7 (label cache.warmfleet.io/new)",
			ReasonImageReady + "/Normal":   "image ubuntu:24.04 is ready at sha256:bb (label " + ImageKey("ubuntu:24.04") + ")",
			ReasonModelFailed + "/Warning": "model cache bad failed: s3: 403 Forbidden",
		})
	})
}

// TestLabelerEventsRefused checks that Events the RBAC refuses cost nothing
// but a log line: the labels still get there, with no retry of the Event.
func TestLabelerEventsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newNode(nil, nil))
		var creates atomic.Int32
		cs.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
			creates.Add(1)
			return true, nil, forbidden()
		})
		l := start(t, cs, func(c *Config) { c.Events = cs.CoreV1().Events(EventNamespace) })
		l.Update(State{})
		synctest.Wait()
		want := State{Models: map[string]string{"a": "r1"}}
		l.Update(want)
		time.Sleep(time.Minute)
		if n := creates.Load(); n != 1 {
			t.Errorf("%d event creates, want 1", n)
		}
		equalMaps(t, "labels", getNode(t, cs).Labels, Desired(want).Labels)
		if got := count(t, l, resultPatched); got != 1 {
			t.Errorf("patched %d times, want 1", got)
		}
	})
}

func TestUpdateCopiesState(t *testing.T) {
	l, err := New(Config{NodeName: node, Nodes: fake.NewClientset().CoreV1().Nodes()})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{"a": "r1"}
	l.Update(State{Models: m})
	m["b"] = "r2"
	s, _ := l.take()
	if !maps.Equal(s.Models, map[string]string{"a": "r1"}) {
		t.Errorf("held state %v changed with the caller's map", s.Models)
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New(Config{Nodes: fake.NewClientset().CoreV1().Nodes()}); err == nil {
		t.Error("no node name: no error")
	}
	if _, err := New(Config{NodeName: node}); err == nil {
		t.Error("no client: no error")
	}
}
