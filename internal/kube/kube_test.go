package kube

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/warmfleet/warmfleet/internal/kube/nodelabels"
	"github.com/warmfleet/warmfleet/internal/kube/podendpoints"
)

func TestOutsideCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if InCluster() {
		t.Fatal("InCluster with KUBERNETES_SERVICE_HOST empty")
	}
	c, err := CoreV1(false)
	if c != nil || err != nil {
		t.Fatalf("CoreV1(false) outside a cluster = %v, %v; want nil, nil", c, err)
	}
	// --kubernetes outside a pod is an error, not a silent no-op.
	if _, err := Config(true); !errors.Is(err, rest.ErrNotInCluster) {
		t.Fatalf("Config(true) outside a cluster: %v, want %v", err, rest.ErrNotInCluster)
	}
}

// TestInClusterWithoutToken runs where the kubelet would have mounted a
// service account token but did not (automountServiceAccountToken: false):
// the error says so instead of the daemon running unlabeled.
func TestInClusterWithoutToken(t *testing.T) {
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		t.Skip("this machine has a service account token")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	if !InCluster() {
		t.Fatal("not InCluster with KUBERNETES_SERVICE_HOST set")
	}
	_, err := CoreV1(false)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CoreV1 without a token: %v, want a missing-file error", err)
	}
}

// TestClientOverHTTP runs the client against a loopback server standing in
// for the API server: the paths, verbs, content types and the mapping of a
// 403 Status to a Forbidden error are what a real one expects and sends.
func TestClientOverHTTP(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.String()+" "+r.Header.Get("Content-Type")+" "+string(body))
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/nodes/gpu-1":
			_, _ = io.WriteString(w, `{"apiVersion":"v1","kind":"Node","metadata":{"name":"gpu-1","labels":{"gpu":"h100"}}}`)
		case "/api/v1/namespaces/default/events":
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"Forbidden","code":403,"message":"events is forbidden"}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c, err := NewClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Nodes().Get(t.Context(), "gpu-1", metav1.GetOptions{})
	if err != nil || n.Labels["gpu"] != "h100" {
		t.Fatalf("Get = %+v, %v", n, err)
	}
	patch := `{"metadata":{"labels":{"cache.warmfleet.io/a":"ready"}}}`
	if _, err := c.Nodes().Patch(t.Context(), "gpu-1", types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "warmfleet"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Events("default").Create(t.Context(), &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1.1"}, Reason: "R"}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("Create on a 403: %v, want Forbidden", err)
	}
	want := []string{
		"GET /api/v1/nodes/gpu-1  ",
		"PATCH /api/v1/nodes/gpu-1?fieldManager=warmfleet application/merge-patch+json " + patch,
	}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || !strings.HasPrefix(got[2], "POST /api/v1/namespaces/default/events application/json {") {
		t.Fatalf("requests:\n%s\nwant:\n%s\nPOST /api/v1/namespaces/default/events application/json {...}", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPodsOverHTTP: the pod list and watch reach the paths and query a
// real API server expects (field selector, version, bookmarks, timeout),
// and a watch stream's events and a 410 error event decode.
func TestPodsOverHTTP(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path+"?"+r.URL.Query().Encode())
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") != "true" {
			_, _ = io.WriteString(w, `{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"41"},"items":[{"metadata":{"name":"a","namespace":"infer"}}]}`)
			return
		}
		_, _ = io.WriteString(w, `{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b","namespace":"infer","resourceVersion":"42"}}}
{"type":"ERROR","object":{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"Expired","code":410,"message":"too old"}}
`)
	}))
	defer srv.Close()
	c, err := NewClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Pods("infer").List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=gpu-1"})
	if err != nil || l.ResourceVersion != "41" || len(l.Items) != 1 || l.Items[0].Name != "a" {
		t.Fatalf("List = %+v, %v", l, err)
	}
	secs := int64(300)
	w, err := c.Pods("").Watch(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=gpu-1", ResourceVersion: "41", AllowWatchBookmarks: true, TimeoutSeconds: &secs})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := <-w.ResultChan()
	if p, ok := ev.Object.(*corev1.Pod); ev.Type != watch.Added || !ok || p.Name != "b" || p.ResourceVersion != "42" {
		t.Fatalf("first event %v %+v", ev.Type, ev.Object)
	}
	ev = <-w.ResultChan()
	if ev.Type != watch.Error || !apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) {
		t.Fatalf("second event %v %+v, want a 410 Expired", ev.Type, ev.Object)
	}
	want := []string{
		"GET /api/v1/namespaces/infer/pods?fieldSelector=spec.nodeName%3Dgpu-1",
		"GET /api/v1/pods?allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dgpu-1&resourceVersion=41&timeout=5m0s&timeoutSeconds=300&watch=true",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The client is what the node labeler and the pod watcher take.
var (
	_ nodelabels.Nodes  = Nodes{}
	_ nodelabels.Events = Events{}
	_ podendpoints.Pods = Pods{}
)
