package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/kube/podendpoints"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// serveDaemonWith runs a daemon with args in the background, mod setting
// what no flag reaches (the Kubernetes clients), until the test ends; it
// returns once the daemon serves, with its log.
func serveDaemonWith(t *testing.T, getenv func(string) string, args []string, mod func(*daemonFlags)) *syncBuffer {
	t.Helper()
	log := &syncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		done <- serveDaemonArgs(ctx, &Env{Stdout: log, Stderr: log, Getenv: getenv}, args, s3origin.Options{}, func() { close(started) }, mod)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("daemon: %v\n%s", err, log)
	}
	return log
}

func TestPlanPodEndpoints(t *testing.T) {
	const a, b, c, d, e = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://10.0.0.4:8000", "http://10.0.0.5:8000"
	registered := []api.Endpoint{
		{Model: "m", URL: a, AppliedBy: podOwner},    // unchanged
		{Model: "old", URL: b, AppliedBy: podOwner},  // its model changed
		{Model: "m", URL: c, AppliedBy: podOwner},    // its pod went
		{Model: "m", URL: d},                         // made by hand at a pod's URL
		{Model: "m", URL: "http://127.0.0.1:1"},      // made by hand elsewhere
		{Model: "m", URL: e, AppliedBy: "file:/x.y"}, // applied, its pod's model unknown
	}
	want := map[string]api.Endpoint{a: {Model: "m"}, b: {Model: "new"}, d: {Model: "m"}, e: {}, "http://10.0.0.6:8000": {Model: "x"}, "http://10.0.0.7:8000": {}}
	p := planPodEndpoints(registered, want, true)
	wantAdd := []api.Endpoint{{Model: "new", URL: b, AppliedBy: podOwner}, {Model: "x", URL: "http://10.0.0.6:8000", AppliedBy: podOwner}}
	if !slices.Equal(p.add, wantAdd) || !slices.Equal(p.remove, []string{c}) || !slices.Equal(p.taken, []string{d, e}) {
		t.Fatalf("plan %+v\nwant add %+v, remove [%s], taken [%s %s]", p, wantAdd, c, d, e)
	}
	// Before the first list nothing is removed: an empty set is not known.
	if p := planPodEndpoints(registered, nil, false); len(p.remove)+len(p.add) != 0 {
		t.Fatalf("unsynced plan %+v, want nothing", p)
	}
	// A pod whose server does not name a model yet keeps its registration.
	if p := planPodEndpoints(registered[:1], map[string]api.Endpoint{a: {}}, true); len(p.remove)+len(p.add) != 0 {
		t.Fatalf("model unknown: %+v, want a kept", p)
	}
	// A pod annotated with a new speed is registered again with it.
	if p := planPodEndpoints(registered[:1], map[string]api.Endpoint{a: {Model: "m", Speed: 2}}, true); !slices.Equal(p.add, []api.Endpoint{{Model: "m", URL: a, Speed: 2, AppliedBy: podOwner}}) {
		t.Fatalf("speed annotated: %+v, want a registered at speed 2", p)
	}
}

// TestPodEndpointsRouted runs a daemon with --discover-pods on a fake
// clientset standing in for the API server (none can run here) and a
// router joined to it. Two llmsim servers play inference pods on this
// node at 127.0.0.1: one annotated with a port only (its model asked at
// /v1/models), one claiming a model the node does not hold. The first gets
// traffic with no `endpoint add`; the liar is registered but never routed;
// a pod with a hostile annotation and a pod on another node are ignored;
// a pod that goes unready, and one deleted, lose their endpoints; an
// endpoint added by hand stays.
func TestPodEndpointsRouted(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	s3.PutObject(t, "models", "sim/weights.safetensors", strings.NewReader("weights"), 7)
	simAddr, liarAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	startSim(t, simAddr, "sim")
	startSim(t, liarAddr, "liar")
	portOf := func(addr string) string {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	const node = "gpu-1"
	pod := func(name string, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "infer", Annotations: ann},
			Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	}
	elsewhere := pod("elsewhere", map[string]string{podendpoints.AnnotationPort: "1"})
	elsewhere.Spec.NodeName = "gpu-2"
	cs := fake.NewClientset(
		pod("sim", map[string]string{podendpoints.AnnotationPort: portOf(simAddr)}),
		pod("liar", map[string]string{podendpoints.AnnotationPort: portOf(liarAddr), podendpoints.AnnotationModel: "liar", podendpoints.AnnotationSpeed: "2"}),
		pod("hostile", map[string]string{podendpoints.AnnotationPort: "8000", podendpoints.AnnotationModel: strings.Repeat("../", 1000)}),
		elsewhere)

	dir := t.TempDir()
	sock := "unix://" + filepath.Join(dir, "api.sock")
	gossipAddr := testenv.FreeAddr(t)
	log := serveDaemonWith(t, os.Getenv, []string{
		"--data-dir", filepath.Join(dir, "data"), "--api", sock, "--node-name", "n1",
		"--gossip", gossipAddr, "--insecure-gossip", "--reserve", "0", "--reserve-fraction", "0", "--containerd", "off",
		"--discover-pods", "--discover-pods-namespace", "infer", "--discover-interval", "100ms",
	}, func(f *daemonFlags) {
		f.kubeNode = node
		f.podsConnect = func(ns string) (podendpoints.Pods, error) {
			if ns != "infer" {
				t.Errorf("pods of namespace %q, want --discover-pods-namespace's", ns)
			}
			return cs.CoreV1().Pods(ns), nil
		}
	})
	routerAddr := testenv.FreeAddr(t)
	routerLog := runInBackground(t, "router", "--listen", routerAddr, "--admin-listen", "", "--join", gossipAddr,
		"--gossip", testenv.FreeAddr(t), "--insecure-gossip", "--node-name", "r1")
	cli := func(args ...string) (int, string) {
		var out bytes.Buffer
		code := Run(t.Context(), append(args, "--api", sock), &Env{Stdout: &out, Stderr: &out, Getenv: os.Getenv})
		return code, out.String()
	}
	endpoints := func() []api.Endpoint {
		var eps []api.Endpoint
		cl, err := api.NewClient(sock, "")
		if err != nil {
			t.Fatal(err)
		}
		if eps, err = cl.Endpoints(t.Context()); err != nil {
			t.Fatal(err)
		}
		return eps
	}
	has := func(eps []api.Endpoint, want api.Endpoint) bool { return slices.Contains(eps, want) }
	simEP := api.Endpoint{Model: "sim", URL: "http://" + simAddr, AppliedBy: podOwner}
	liarEP := api.Endpoint{Model: "liar", URL: "http://" + liarAddr, Speed: 2, AppliedBy: podOwner}
	wait.For(t, "both pods registered", func() bool {
		eps := endpoints()
		return has(eps, simEP) && has(eps, liarEP)
	})
	if eps := endpoints(); len(eps) != 2 {
		t.Fatalf("endpoints %+v: only the two good pods of this node", eps)
	}
	if !strings.Contains(log.String(), "pod infer/hostile: annotation warmfleet.io/model") {
		t.Errorf("the hostile pod's error is not in the log:\n%s", log)
	}
	if code, out := cli("endpoint", "add", "--model", "sim", "--url", "http://127.0.0.1:1"); code != 0 {
		t.Fatalf("endpoint add: exit %d: %s", code, out)
	}
	if code, out := cli("cache", "add", "sim", "--source", "s3://models/sim/", "--wait", "--timeout", "60s"); code != 0 {
		t.Fatalf("cache add: exit %d: %s", code, out)
	}
	wait.Err(t, "a request for sim served through the pod's endpoint", func() error {
		if code, body := complete(routerAddr, "sim"); code != http.StatusOK {
			return fmt.Errorf("status %d: %s; router log:\n%s", code, body, routerLog)
		}
		return nil
	})
	if code, body := complete(routerAddr, "liar"); code == http.StatusOK {
		t.Fatalf("request for liar routed to a pod whose model the node does not hold: %s", body)
	}

	pods := cs.CoreV1().Pods("infer")
	sim, err := pods.Get(t.Context(), "sim", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sim.Status.Conditions[0].Status = corev1.ConditionFalse
	if _, err := pods.UpdateStatus(t.Context(), sim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the unready pod's endpoint removed", func() bool {
		eps := endpoints()
		return !has(eps, simEP) && has(eps, liarEP)
	})
	if err := pods.Delete(t.Context(), "liar", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the deleted pod's endpoint removed", func() bool { return !has(endpoints(), liarEP) })
	if eps := endpoints(); len(eps) != 1 || eps[0].URL != "http://127.0.0.1:1" {
		t.Fatalf("endpoints %+v: want the hand-made one kept", eps)
	}
}
