package cli

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/client"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"

	imagecache "github.com/warmfleet/warmfleet/containerd"
	"github.com/warmfleet/warmfleet/daemon"
	"github.com/warmfleet/warmfleet/desired"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/health"
	"github.com/warmfleet/warmfleet/internal/kube/nodelabels"
	"github.com/warmfleet/warmfleet/internal/kube/podendpoints"
	"github.com/warmfleet/warmfleet/internal/testutil/metricsdoc"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/p2p"
	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/peer"
)

var updateMetricsDoc = flag.Bool("update-metrics-doc", false, "rewrite docs/metrics.md from the registries")

const metricsDocHeader = `# Metrics reference

Every Prometheus metric the warmfleet daemon and router export, as their
code registers it. Generated from the registries by
` + "`go generate ./internal/cli`" + ` (TestMetricsReference fails when this
file and the code differ): do not edit by hand.

Both also export the Go runtime's ` + "`go_*`" + ` and the process's
` + "`process_*`" + ` metrics (client_golang's standard collectors), not listed.
The daemon serves ` + "`/metrics`" + ` on its API and, without a token, on
` + "`--metrics-listen`" + `; the router on ` + "`--admin-listen`" + `.
`

// daemonCollectors builds the parts of a daemon that register metrics, as
// serveDaemon wires them (the swarm, gossip and the image cache all on the
// daemon's registry), and returns what they registered.
func daemonCollectors(t *testing.T, log *slog.Logger) []prometheus.Collector {
	base, err := daemon.Open(daemon.Config{NodeName: "doc", DataDir: t.TempDir(), PartSize: 1 << 20, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	node, err := p2p.NewNode(p2p.Config{NodeID: "doc", Keyring: func() [][]byte { return [][]byte{make([]byte, 32)} }, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(base, nil, daemon.Deps{Swarm: node})
	if err != nil {
		base.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	startGossipForDoc(t, log, d.Registry(), gossip.RoleNode, d.Desired())
	// The client dials lazily: the cache registers its metrics without a
	// containerd to talk to.
	cl, err := client.New(filepath.Join(t.TempDir(), "no-containerd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	if _, err := imagecache.New(cl, imagecache.Options{Namespace: "k8s.io", Registerer: d.Registry(), Logger: log}); err != nil {
		t.Fatal(err)
	}
	// The node labeler (in a Kubernetes pod) registers on it too.
	if _, err := nodelabels.New(nodelabels.Config{NodeName: "doc", Nodes: fake.NewClientset().CoreV1().Nodes(), Registerer: d.Registry(), Logger: log}); err != nil {
		t.Fatal(err)
	}
	// So does the pod watcher (--discover-pods).
	if _, err := podendpoints.New(podendpoints.Config{NodeName: "doc", Pods: fake.NewClientset().CoreV1().Pods(""), Registerer: d.Registry(), Logger: log}); err != nil {
		t.Fatal(err)
	}
	return d.Registry().Collectors()
}

// routerCollectors builds the parts of a router that register metrics, as
// serveRouter wires them: gossip, the peer link and the router.
func routerCollectors(t *testing.T, log *slog.Logger) []prometheus.Collector {
	reg := health.NewRegistry()
	startGossipForDoc(t, log, reg, gossip.RoleRouter, nil)
	link, err := peer.NewLink("doc", []string{"http://127.0.0.1:1"}, make([]byte, 32), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(link)
	// A backend with a KV event feed, so the feeds' collector has samples
	// to describe (the feed is not started: the router does not Run).
	cfg := router.Defaults()
	cfg.Backends = []router.BackendConfig{{URL: "http://127.0.0.1:1", KVEvents: "bind:tcp://127.0.0.1:0"}}
	if _, err := router.New(cfg, router.Options{Source: router.NewStaticSource(router.StaticEndpoints(&cfg), nil), Registry: reg, Logger: log}); err != nil {
		t.Fatal(err)
	}
	return reg.Collectors()
}

func startGossipForDoc(t *testing.T, log *slog.Logger, reg prometheus.Registerer, role gossip.Role, desired *desired.State) {
	t.Helper()
	n, err := gossip.Start(t.Context(), gossip.Config{NodeName: "doc", BindAddr: "127.0.0.1:0", Insecure: true,
		Role: role, Desired: desired, Registerer: reg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
}

// TestMetricsReference: docs/metrics.md lists exactly the metrics the
// daemon and the router register; -update-metrics-doc rewrites it.
func TestMetricsReference(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var sections []metricsdoc.Section
	for _, part := range []struct {
		title, intro string
		collectors   func(*testing.T, *slog.Logger) []prometheus.Collector
	}{
		{"Daemon", "`warmfleet daemon`: the cache, its S3 and peer traffic, gossip, image pre-pulls, node labels and pod endpoints.", daemonCollectors},
		{"Router", "`warmfleet router`: routing decisions, backends, gossip and peer replicas.", routerCollectors},
	} {
		ms, err := metricsdoc.Reference("warmfleet_", part.collectors(t, log))
		if err != nil {
			t.Fatalf("%s metrics: %v", part.title, err)
		}
		sections = append(sections, metricsdoc.Section{Title: part.title, Intro: part.intro, Metrics: ms})
	}
	got := metricsdoc.Markdown(metricsDocHeader, sections)
	path := filepath.Join(testenv.RepoRoot(), "docs", "metrics.md")
	if *updateMetricsDoc {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run go generate ./internal/cli", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("docs/metrics.md differs from the metrics the code registers: run go generate ./internal/cli\ngenerated:\n%s", got)
	}
}
