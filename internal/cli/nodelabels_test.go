package cli

import (
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/kube/nodelabels"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

func TestWarmState(t *testing.T) {
	got := warmState([]api.CacheStatus{
		{Name: "ready", State: api.StateReady, Ready: true, RevisionID: "r1"},
		// A new revision still downloading: the daemon reports it not ready.
		{Name: "updating", State: api.StateDownloading, RevisionID: "r2"},
		{Name: "broken", State: api.StateFailed, Error: "s3: 403"},
		{Name: "elsewhere", State: api.StateNotTargeted},
	}, []api.ImageStatus{
		{Ref: "docker.io/library/a:1", State: "ready", Digest: "sha256:aa", Wanted: []string{"ops"}},
		{Ref: "docker.io/library/kubelet-pulled:1", State: "ready", Digest: "sha256:bb"},
		{Ref: "docker.io/library/pulling:1", State: "pulling", Wanted: []string{"ops"}},
		{Ref: "docker.io/library/bad:1", State: "failed", Error: "401", Wanted: []string{"ops"}},
	})
	want := nodelabels.State{
		Models:       map[string]string{"ready": "r1"},
		Images:       map[string]string{"docker.io/library/a:1": "sha256:aa"},
		FailedModels: map[string]string{"broken": "s3: 403"},
		FailedImages: map[string]string{"docker.io/library/bad:1": "401"},
	}
	if !sameState(got, want) {
		t.Errorf("warmState = %+v\nwant %+v", got, want)
	}
}

func TestKubernetesFlag(t *testing.T) {
	for in, want := range map[string]autoFlag{"auto": {}, "true": {true, true}, "false": {true, false}, "1": {true, true}} {
		var a autoFlag
		if err := a.Set(in); err != nil || a != want {
			t.Errorf("Set(%q) = %+v, %v; want %+v", in, a, err, want)
		}
	}
	var a autoFlag
	if err := a.Set("yes please"); err == nil {
		t.Error("Set(yes please): no error")
	}
}

// TestKubernetesOutsideCluster: --kubernetes on a machine that is not a
// pod stops the daemon with the reason instead of running unlabelled.
func TestKubernetesOutsideCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := t.TempDir()
	var out syncBuffer
	code := Run(t.Context(), []string{"daemon", "--data-dir", filepath.Join(dir, "data"), "--api", "unix://" + filepath.Join(dir, "api.sock"),
		"--containerd", "off", "--kubernetes"}, &Env{Stdout: &out, Stderr: &out, Getenv: noEnv})
	if code != exitUsage || !strings.Contains(out.String(), "--kubernetes: kubernetes in-cluster config") {
		t.Errorf("exit %d, output %q; want a usage error naming the missing in-cluster config", code, out.String())
	}
}

// TestDaemonLabelsItsNode runs a daemon against client-go's fake clientset:
// a cache that becomes ready puts its label and revision on the Node, a
// removed cache takes them off, stale warmfleet labels go at start and
// other owners' labels stay. The API server refuses the first patches
// (RBAC not yet bound): that is logged, counted and retried, and the cache
// itself never waits for it.
func TestDaemonLabelsItsNode(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	s3.PutObject(t, "models", "tiny/model.safetensors", strings.NewReader("weights"), 7)

	const node = "gpu-1"
	stale := nodelabels.ModelKey("stale")
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
		Labels: map[string]string{"gpu": "h100", stale: "ready"}, Annotations: map[string]string{stale: "r0"}}})
	var refused atomic.Int32
	cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refused.Add(1) <= 2 {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, node, errors.New("RBAC: not bound yet"))
		}
		return false, nil, nil
	})

	dir := t.TempDir()
	sock := "unix://" + filepath.Join(dir, "api.sock")
	log := serveDaemonWith(t, noEnv, []string{
		"--data-dir", filepath.Join(dir, "data"), "--api", sock, "--node-name", "host-name-not-node-name",
		"--part-size", "1MiB", "--reserve", "0", "--reserve-fraction", "0", "--containerd", "off",
		"--kubernetes", "--node-events",
	}, func(f *daemonFlags) {
		f.kubeNode = node
		f.labelPoll = 50 * time.Millisecond
		f.kubeConnect = func(force bool) (nodelabels.Nodes, nodelabels.Events, error) {
			if !force {
				t.Error("--kubernetes did not force the connection")
			}
			return cs.CoreV1().Nodes(), cs.CoreV1().Events(nodelabels.EventNamespace), nil
		}
	})

	getNode := func() *corev1.Node {
		n, err := cs.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The cache gets ready while the Node cannot be patched.
	if code, stderr := runBounded(t, sock, "cache", "add", "tiny", "--source", "s3://models/tiny/", "--wait"); code != 0 {
		t.Fatalf("cache add --wait: exit %d: %s", code, stderr)
	}
	c, err := api.NewClient(sock, "")
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Cache(t.Context(), "tiny")
	if err != nil || !st.Ready {
		t.Fatalf("cache tiny: %+v, %v", st, err)
	}
	key := nodelabels.ModelKey("tiny")
	wait.For(t, "the Node labelled with the ready cache", func() bool {
		n := getNode()
		return n.Labels[key] == "ready" && n.Annotations[key] == st.RevisionID && n.Labels[stale] == ""
	})
	n := getNode()
	if n.Labels["gpu"] != "h100" || n.Annotations[stale] != "" {
		t.Errorf("labels %v, annotations %v: want gpu=h100 kept and the stale annotation gone", n.Labels, n.Annotations)
	}
	if refused.Load() < 3 {
		t.Errorf("%d patches, want the 2 refused and one more", refused.Load())
	}
	if !strings.Contains(log.String(), "node labels: sync failed; retrying") || !strings.Contains(log.String(), "RBAC: not bound yet") {
		t.Errorf("the refusal is not logged:\n%s", log)
	}
	metrics, err := c.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `warmfleet_node_label_syncs_total{result="forbidden"} 2`) {
		t.Errorf("metrics do not count the 2 refusals:\n%s", grepLines(metrics, "node_label"))
	}
	wait.For(t, "a ModelCacheReady Event on the Node", func() bool {
		evs, err := cs.CoreV1().Events(nodelabels.EventNamespace).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Items {
			if ev.Reason == nodelabels.ReasonModelReady && ev.InvolvedObject.Name == node && strings.Contains(ev.Message, "tiny") {
				return true
			}
		}
		return false
	})

	if code, stderr := runBounded(t, sock, "cache", "rm", "tiny"); code != 0 {
		t.Fatalf("cache rm: exit %d: %s", code, stderr)
	}
	wait.For(t, "the label and annotation of the removed cache gone", func() bool {
		n := getNode()
		_, l := n.Labels[key]
		_, a := n.Annotations[key]
		return !l && !a && n.Labels["gpu"] == "h100"
	})
}
