package cli

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/kube"
	"github.com/warmfleet/warmfleet/internal/kube/podendpoints"
)

// Pod discovery (--discover-pods): the daemon watches the pods on its own
// Kubernetes Node annotated warmfleet.io/endpoint-port
// (internal/kube/podendpoints) and registers each ready one as an
// endpoint, for the model of its warmfleet.io/model annotation or, without
// one, a model its server lists at /v1/models (pickModel's rule). The
// endpoints it registers record the owner podOwner (applied_by), so it
// removes its own only: a pod that goes unready or is deleted loses its
// endpoint with the watch event, an endpoint someone else registered at a
// pod's URL is left alone (and the pod skipped, logged), and `apply`
// refuses to change the discovery's endpoints as another owner's.

// podOwner is the applied_by of the endpoints pod discovery registers.
const podOwner = "kubernetes:pods"

// podsConnector returns the Pod API of namespace ("" for all).
type podsConnector func(namespace string) (podendpoints.Pods, error)

// inClusterPods connects with the pod's service account.
func inClusterPods(namespace string) (podendpoints.Pods, error) {
	c, err := kube.CoreV1(true)
	if err != nil {
		return nil, err
	}
	return c.Pods(namespace), nil
}

// podPlan is what one pass of pod discovery changes.
type podPlan struct {
	add    []api.Endpoint
	remove []string
	// taken are pods' URLs where an endpoint of another owner is.
	taken []string
}

// planPodEndpoints decides, from this node's registered endpoints and the
// ready pods' endpoints by URL (a Model of "" when not known yet: the
// server did not answer), which endpoints to add or change and which of
// the discovery's to remove. Before the watcher's first list (synced
// false) nothing is removed: an empty set then means "not known".
func planPodEndpoints(registered []api.Endpoint, want map[string]api.Endpoint, synced bool) podPlan {
	var p podPlan
	cur := map[string]api.Endpoint{}
	for _, ep := range registered {
		cur[ep.URL] = ep
	}
	for _, u := range slices.Sorted(maps.Keys(want)) {
		w := want[u]
		ep, ok := cur[u]
		switch {
		case ok && ep.AppliedBy != podOwner:
			p.taken = append(p.taken, u)
		case w.Model == "":
			// Keep what is registered until the server names a model.
		case !ok || ep.Model != w.Model || ep.Speed != w.Speed:
			p.add = append(p.add, api.Endpoint{Model: w.Model, URL: u, Speed: w.Speed, AppliedBy: podOwner})
		}
	}
	if !synced {
		return p
	}
	for _, ep := range registered {
		if _, ok := want[ep.URL]; !ok && ep.AppliedBy == podOwner {
			p.remove = append(p.remove, ep.URL)
		}
	}
	return p
}

// startPodDiscovery watches this node's pods and keeps their endpoints
// registered, when --discover-pods is set.
func startPodDiscovery(ps *parts, log *slog.Logger, f *daemonFlags, reg endpointRegistry, registry prometheus.Registerer) error {
	if !f.discoverPods {
		return nil
	}
	connect := f.podsConnect
	if connect == nil {
		connect = inClusterPods
	}
	pods, err := connect(f.podsNamespace)
	if err != nil {
		return usageError("--discover-pods: %v", err)
	}
	nodeName := f.kubeNode
	if nodeName == "" {
		nodeName = f.nodeName
	}
	log = log.With("component", "pod-discovery")
	w, err := podendpoints.New(podendpoints.Config{NodeName: nodeName, Pods: pods, Logger: log, Registerer: registry})
	if err != nil {
		return usageError("%v", err)
	}
	ns := f.podsNamespace
	if ns == "" {
		ns = "(all)"
	}
	log.Info("registering the annotated pods of this Kubernetes Node as endpoints", "node", nodeName, "namespace", ns, "annotation", podendpoints.AnnotationPort)
	ps.start(stageListeners, "pod watcher", w.Run, nil)
	ps.start(stageListeners, "pod endpoints", followPods(log, reg, w, f.discoverEvery), nil)
	return nil
}

// followPods registers the watcher's endpoints at each change it signals
// and every interval (servers without a model annotation are asked again,
// and a failed registration is retried).
func followPods(log *slog.Logger, reg endpointRegistry, w *podendpoints.Watcher, interval time.Duration) func(context.Context) error {
	client := &http.Client{Timeout: max(interval/2, time.Second)}
	return func(ctx context.Context) error {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-w.Updates():
			case <-t.C:
			}
			syncPods(ctx, log, reg, w, client)
		}
	}
}

func syncPods(ctx context.Context, log *slog.Logger, reg endpointRegistry, w *podendpoints.Watcher, client *http.Client) {
	found, synced := w.Endpoints()
	registered, err := reg.Endpoints()
	if err != nil {
		log.Warn("pod endpoints: reading endpoints", "err", err)
		return
	}
	ready := map[string]bool{}
	want := map[string]api.Endpoint{}
	pods := map[string]string{}
	for _, ep := range found {
		pods[ep.URL] = ep.Pod
		if ep.Model != "" {
			want[ep.URL] = api.Endpoint{Model: ep.Model, Speed: ep.Speed}
			continue
		}
		if len(ready) == 0 {
			caches, err := reg.Caches()
			if err != nil {
				log.Warn("pod endpoints: reading caches", "err", err)
			}
			for _, c := range caches {
				ready[c.Name] = c.Ready
			}
		}
		models, err := probeModels(ctx, client, ep.URL)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			log.Debug("pod endpoints: server not answering yet", "pod", ep.Pod, "err", err)
		}
		want[ep.URL] = api.Endpoint{Model: pickModel(models, ready), Speed: ep.Speed}
	}
	p := planPodEndpoints(registered, want, synced)
	for _, u := range p.taken {
		log.Debug("pod endpoints: another owner's endpoint holds the pod's URL; pod skipped", "pod", pods[u], "url", u)
	}
	for _, ep := range p.add {
		if err := reg.AddEndpoint(ctx, ep); err != nil {
			log.Warn("pod endpoints: register", "pod", pods[ep.URL], "url", ep.URL, "err", err)
			continue
		}
		log.Info("pod endpoint registered", "pod", pods[ep.URL], "url", ep.URL, "model", ep.Model, "speed", ep.Speed)
	}
	for _, u := range p.remove {
		if _, err := reg.RemoveEndpoint(ctx, u); err != nil {
			log.Warn("pod endpoints: unregister", "url", u, "err", err)
			continue
		}
		log.Info("pod endpoint removed: its pod is gone or not ready", "url", u)
	}
}
