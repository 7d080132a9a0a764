package podendpoints

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/warmfleet/warmfleet/internal/testutil/bg"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// start runs a Watcher on cs's pods of all namespaces inside the current
// synctest bubble and stops it when the test ends.
func start(t *testing.T, cs *fake.Clientset, mod func(*Config)) *Watcher {
	t.Helper()
	cfg := Config{NodeName: node, Pods: cs.CoreV1().Pods(""), MinBackoff: time.Second, MaxBackoff: time.Minute,
		Resync: time.Hour, WatchTimeout: 5 * time.Minute}
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bg.Run(t, w.Run)
	return w
}

func urls(w *Watcher) []string {
	eps, _ := w.Endpoints()
	var out []string
	for _, ep := range eps {
		out = append(out, ep.URL)
	}
	return out
}

func value(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Gauge != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}

// actions counts the client's calls of a verb on pods.
func actions(cs *fake.Clientset, verb string) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

// TestWatcherFollowsPods: a ready annotated pod on the node is an endpoint
// from the first list; one that starts later joins with its watch event;
// a pod whose readiness probe fails leaves at once and comes back when it
// passes; a deleted pod leaves; pods on other nodes or without the
// annotation never count.
func TestWatcherFollowsPods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		other := newPod("elsewhere", "10.9.9.9", port("8000"))
		other.Spec.NodeName = "gpu-2"
		cs := fake.NewClientset(newPod("a", "10.0.0.1", port("8000")), other, newPod("plain", "10.0.0.9", nil))
		w := start(t, cs, nil)
		synctest.Wait()
		if got, synced := w.Endpoints(); !synced || len(got) != 1 || got[0] != (Endpoint{URL: "http://10.0.0.1:8000", Pod: "infer/a"}) {
			t.Fatalf("after the list: %+v, synced %v", got, synced)
		}
		<-w.Updates() // the first list signals
		if l := cs.Actions()[0].(k8stesting.ListActionImpl); l.GetListRestrictions().Fields.String() != "spec.nodeName="+node {
			t.Errorf("list field selector %q, want this node's pods only", l.GetListRestrictions().Fields)
		}

		pods := cs.CoreV1().Pods("infer")
		b := newPod("b", "10.0.0.2", map[string]string{AnnotationPort: "http", AnnotationModel: "llama"})
		if _, err := pods.Create(t.Context(), b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := urls(w); !slices.Equal(got, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}) {
			t.Fatalf("after b started: %v", got)
		}
		select {
		case <-w.Updates():
		default:
			t.Error("no update signalled for a new endpoint")
		}

		b.Status.Conditions[0].Status = corev1.ConditionFalse
		if _, err := pods.UpdateStatus(t.Context(), b, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := urls(w); !slices.Equal(got, []string{"http://10.0.0.1:8000"}) {
			t.Fatalf("after b went unready: %v", got)
		}
		if n := value(t, w.pods.WithLabelValues(string(NotReady))); n != 1 {
			t.Errorf("not_ready pods %v, want 1", n)
		}
		b.Status.Conditions[0].Status = corev1.ConditionTrue
		if _, err := pods.UpdateStatus(t.Context(), b, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := urls(w); len(got) != 2 {
			t.Fatalf("after b was ready again: %v", got)
		}

		if err := pods.Delete(t.Context(), "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got, _ := w.Endpoints(); len(got) != 1 || got[0] != (Endpoint{URL: "http://10.0.0.2:8000", Model: "llama", Pod: "infer/b"}) {
			t.Fatalf("after a was deleted: %+v", got)
		}
		if n := actions(cs, "list"); n != 1 {
			t.Errorf("%d lists: the watch alone must follow the changes", n)
		}
	})
}

// scriptedWatches makes every Watch of pods on cs return the next of a
// list of fake watchers the test drives, and records the resource version
// each watch asked to start from.
type scriptedWatches struct {
	mu      sync.Mutex
	next    chan *watch.FakeWatcher
	fromRVs []string
}

func script(cs *fake.Clientset) *scriptedWatches {
	s := &scriptedWatches{next: make(chan *watch.FakeWatcher, 8)}
	cs.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		s.mu.Lock()
		s.fromRVs = append(s.fromRVs, a.(k8stesting.WatchActionImpl).GetWatchRestrictions().ResourceVersion)
		s.mu.Unlock()
		select {
		case fw := <-s.next:
			return true, fw, nil
		default:
			return true, nil, errors.New("connection refused")
		}
	})
	return s
}

func (s *scriptedWatches) push() *watch.FakeWatcher {
	fw := watch.NewFakeWithChanSize(8, false)
	s.next <- fw
	return fw
}

func (s *scriptedWatches) rvs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.fromRVs)
}

// TestWatchDropsAndResumes: a watch the server closes resumes from the
// last version seen (an event's or a bookmark's) with no new list; a
// watch whose version expired (410) lists again, and the list's view
// replaces the old one (a pod deleted while no watch ran is gone); a
// watch that cannot start is retried after a backoff.
func TestWatchDropsAndResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newPod("a", "10.0.0.1", port("8000"))
		cs := fake.NewClientset(a)
		s := script(cs)
		first := s.push()
		w := start(t, cs, nil)
		synctest.Wait()

		b := newPod("b", "10.0.0.2", port("8000"))
		b.ResourceVersion = "105"
		first.Add(b)
		first.Action(watch.Bookmark, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "110"}})
		synctest.Wait()
		if got := urls(w); len(got) != 2 {
			t.Fatalf("after b's event: %v", got)
		}
		// The connection drops; the watcher resumes from the bookmark.
		second := s.push()
		first.Stop()
		synctest.Wait()
		if got := s.rvs(); len(got) != 2 || got[1] != "110" {
			t.Fatalf("watches started from %q, want the second from the bookmark's 110", got)
		}
		if n := actions(cs, "list"); n != 1 {
			t.Fatalf("%d lists after a dropped watch, want 1: resuming needs none", n)
		}
		if n := value(t, w.restarts.WithLabelValues(restartClosed)); n != 1 {
			t.Errorf("closed restarts %v, want 1", n)
		}

		// While the watch is down the pod a goes; the next watch is refused
		// as too old: the watcher lists again and a is gone.
		if err := cs.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), "infer", "a"); err != nil {
			t.Fatal(err)
		}
		third := s.push()
		second.Error(&apierrors.NewResourceExpired("too old resource version: 110 (200)").ErrStatus)
		synctest.Wait()
		if n := actions(cs, "list"); n != 2 {
			t.Fatalf("%d lists after a 410, want 2", n)
		}
		if got := urls(w); len(got) != 0 {
			// b came from a watch event the tracker never held: the list
			// knows neither.
			t.Fatalf("after the relist: %v, want none", got)
		}
		if n := value(t, w.restarts.WithLabelValues(restartExpired)); n != 1 {
			t.Errorf("expired restarts %v, want 1", n)
		}

		// The next watch cannot start (no scripted watcher: refused): one
		// backoff later it is tried again, from the same version.
		third.Stop()
		synctest.Wait()
		n := len(s.rvs())
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := s.rvs(); len(got) <= n {
			t.Fatalf("watch not retried after its backoff: %q", got)
		}
		if v := value(t, w.restarts.WithLabelValues(restartError)); v < 1 {
			t.Errorf("error restarts %v, want >= 1", v)
		}
	})
}

// TestWatchErrorEvent: a watch that sends an error other than 410 backs
// off and resumes from the last version, keeping what it knows.
func TestWatchErrorEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newPod("a", "10.0.0.1", port("8000")))
		s := script(cs)
		first := s.push()
		w := start(t, cs, nil)
		synctest.Wait()
		p := newPod("a", "10.0.0.1", port("8000"))
		p.ResourceVersion = "7"
		first.Modify(p)
		s.push()
		first.Error(&apierrors.NewInternalError(errors.New("etcd leader changed")).ErrStatus)
		synctest.Wait()
		if got := urls(w); len(got) != 1 {
			t.Fatalf("after an error event: %v, want a kept", got)
		}
		if got := s.rvs(); len(got) != 1 {
			t.Fatalf("resumed before the backoff: %q", got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := s.rvs(); len(got) != 2 || got[1] != "7" {
			t.Fatalf("watches from %q, want a second from 7 after the backoff", got)
		}
		if n := actions(cs, "list"); n != 1 {
			t.Errorf("%d lists, want 1", n)
		}
	})
}

// TestListRefusedThenResync: a refused list (RBAC not bound yet) is
// counted as forbidden and retried with a growing backoff; nothing is
// known (synced false) until one succeeds. Every Resync it lists again.
func TestListRefusedThenResync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newPod("a", "10.0.0.1", port("8000")))
		refusals := 3
		cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			if refusals > 0 {
				refusals--
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "",
					errors.New(`User "system:serviceaccount:warmfleet:warmfleet" cannot list resource "pods"`))
			}
			return false, nil, nil
		})
		w := start(t, cs, func(c *Config) { c.Resync = 30 * time.Minute })
		synctest.Wait()
		if _, synced := w.Endpoints(); synced {
			t.Fatal("synced after a refused list")
		}
		// Backoffs of at most 1 s, 2 s, 4 s.
		time.Sleep(7 * time.Second)
		synctest.Wait()
		if got, synced := w.Endpoints(); !synced || len(got) != 1 {
			t.Fatalf("after the refusals: %+v, synced %v", got, synced)
		}
		if n := value(t, w.lists.WithLabelValues(listForbidden)); n != 3 {
			t.Errorf("forbidden lists %v, want 3", n)
		}
		time.Sleep(30 * time.Minute)
		synctest.Wait()
		if n := value(t, w.lists.WithLabelValues(listOK)); n != 2 {
			t.Errorf("ok lists %v after one Resync, want 2", n)
		}
		if n := value(t, w.restarts.WithLabelValues(restartResync)); n != 1 {
			t.Errorf("resync restarts %v, want 1", n)
		}
	})
}

// TestHostileAnnotations: pods with bad annotations get no endpoint, are
// counted once per value (not once per event), and do not disturb the
// others; fixing the annotation makes the pod an endpoint.
func TestHostileAnnotations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newPod("good", "10.0.0.1", port("8000")),
			newPod("bad", "10.0.0.2", port("99999")))
		w := start(t, cs, nil)
		synctest.Wait()
		if got := urls(w); !slices.Equal(got, []string{"http://10.0.0.1:8000"}) {
			t.Fatalf("endpoints %v, want the good pod only", got)
		}
		if v, r := value(t, w.pods.WithLabelValues(string(Invalid))), value(t, w.rejects); v != 1 || r != 1 {
			t.Fatalf("invalid pods %v, rejects %v; want 1, 1", v, r)
		}
		pods := cs.CoreV1().Pods("infer")
		bad, err := pods.Get(t.Context(), "bad", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// A status change with the same bad value: not counted again.
		bad.Status.Message = "still here"
		if bad, err = pods.UpdateStatus(t.Context(), bad, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if r := value(t, w.rejects); r != 1 {
			t.Errorf("rejects %v after an event with the same value, want 1", r)
		}
		bad.Annotations = map[string]string{AnnotationPort: "8000", AnnotationModel: string(make([]byte, 300000))}
		if bad, err = pods.Update(t.Context(), bad, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if r := value(t, w.rejects); r != 2 {
			t.Errorf("rejects %v after a new bad value, want 2", r)
		}
		bad.Annotations = port("http")
		if _, err = pods.Update(t.Context(), bad, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := urls(w); len(got) != 2 || value(t, w.pods.WithLabelValues(string(Invalid))) != 0 {
			t.Fatalf("after the fix: %v", got)
		}
	})
}

// TestWatchOtherObject: a watch that delivers something that is not a Pod
// (a misbehaving proxy) is an error to back off from, not a crash.
func TestWatchOtherObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		s := script(cs)
		first := s.push()
		w := start(t, cs, nil)
		synctest.Wait()
		first.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "x"}})
		synctest.Wait()
		if v := value(t, w.restarts.WithLabelValues(restartError)); v != 1 {
			t.Errorf("error restarts %v, want 1", v)
		}
	})
}

func TestNewChecksConfig(t *testing.T) {
	if _, err := New(Config{Pods: fake.NewClientset().CoreV1().Pods("")}); err == nil {
		t.Error("New without a node name: no error")
	}
	if _, err := New(Config{NodeName: node}); err == nil {
		t.Error("New without a Pod client: no error")
	}
}
