package cli

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	imagecache "github.com/warmfleet/warmfleet/containerd"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/kube"
	"github.com/warmfleet/warmfleet/internal/kube/nodelabels"
)

// autoFlag is a boolean flag with a third value, auto, its default: the
// daemon decides. "--kubernetes" alone means true.
type autoFlag struct{ set, on bool }

func (a *autoFlag) String() string {
	if !a.set {
		return "auto"
	}
	return strconv.FormatBool(a.on)
}

func (a *autoFlag) Set(v string) error {
	if v == "auto" {
		*a = autoFlag{}
		return nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("want true, false or auto")
	}
	*a = autoFlag{set: true, on: on}
	return nil
}

// Type names the value in help.
func (a *autoFlag) Type() string { return "true|false|auto" }

// nodeLabelPoll is how often the daemon's caches are read for the Node's
// labels. A read costs a state read and a containerd listing; only a
// change reaches the API server.
const nodeLabelPoll = 5 * time.Second

// kubeConnector returns the Node and Event APIs, or nil ones when the
// daemon is not in a cluster and force is off.
type kubeConnector func(force bool) (nodelabels.Nodes, nodelabels.Events, error)

// inCluster connects with the pod's service account (kube.CoreV1).
func inCluster(force bool) (nodelabels.Nodes, nodelabels.Events, error) {
	c, err := kube.CoreV1(force)
	if c == nil || err != nil {
		return nil, nil, err
	}
	return c.Nodes(), c.Events(nodelabels.EventNamespace), nil
}

// warmSource is what the node labels read from the daemon (daemon.Daemon).
type warmSource interface {
	Caches() ([]api.CacheStatus, error)
	Images(ctx context.Context) ([]api.ImageStatus, error)
}

// startNodeLabels labels this daemon's Kubernetes Node with what is ready
// on it (internal/kube/nodelabels) when the daemon runs in a pod or
// --kubernetes is set; --kubernetes=false turns it off. In a pod whose
// service account token is not mounted it logs why and runs without
// labels; with --kubernetes that is an error. The Node is NODE_NAME (the
// chart sets it from spec.nodeName), else --node-name.
func startNodeLabels(ps *parts, log *slog.Logger, f *daemonFlags, src warmSource, images bool, reg prometheus.Registerer) error {
	if f.kubernetes.set && !f.kubernetes.on {
		return nil
	}
	connect := f.kubeConnect
	if connect == nil {
		connect = inCluster
	}
	nodes, events, err := connect(f.kubernetes.on)
	if err != nil {
		if f.kubernetes.on {
			return usageError("--kubernetes: %v", err)
		}
		log.Warn("node labels off: running in a pod, but no Kubernetes API access (mount the service account token, or set --kubernetes=false)", "err", err)
		return nil
	}
	if nodes == nil {
		return nil
	}
	nodeName := f.kubeNode
	if nodeName == "" {
		nodeName = f.nodeName
	}
	cfg := nodelabels.Config{NodeName: nodeName, Nodes: nodes, Logger: log.With("component", "node-labels"), Registerer: reg}
	if f.nodeEvents {
		cfg.Events = events
	}
	l, err := nodelabels.New(cfg)
	if err != nil {
		return usageError("%v", err)
	}
	log.Info("labelling the Kubernetes Node with the caches ready on it", "node", nodeName, "events", f.nodeEvents)
	ps.start(stageListeners, "node labeler", l.Run, nil)
	poll := f.labelPoll
	if poll <= 0 {
		poll = nodeLabelPoll
	}
	ps.start(stageListeners, "node label source", feedLabels(log, src, images, l, poll), nil)
	return nil
}

// feedLabels reads what is ready on the node every poll and hands the
// labeler each State that differs from the last one. It never waits on the
// labeler (Update does not block), so an API server that refuses or is
// away costs the daemon nothing. A read that fails is skipped, not taken
// as "nothing ready": a state read error must not strip the Node's labels.
func feedLabels(log *slog.Logger, src warmSource, images bool, l *nodelabels.Labeler, poll time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		t := time.NewTicker(poll)
		defer t.Stop()
		var last *nodelabels.State
		for {
			s, err := readWarm(ctx, src, images)
			if err != nil {
				log.Warn("node labels: reading the node's caches", "err", err)
			} else if last == nil || !sameState(*last, s) {
				l.Update(s)
				last = &s
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}

func readWarm(ctx context.Context, src warmSource, images bool) (nodelabels.State, error) {
	caches, err := src.Caches()
	if err != nil {
		return nodelabels.State{}, fmt.Errorf("caches: %w", err)
	}
	var ims []api.ImageStatus
	if images {
		if ims, err = src.Images(ctx); err != nil {
			return nodelabels.State{}, fmt.Errorf("images: %w", err)
		}
	}
	return warmState(caches, ims), nil
}

// warmState is what the Node's labels say for these statuses: a model
// cache ready on this node at the revision the fleet wants (the daemon
// reports a cache whose new revision is still coming as not ready), an
// image the fleet asks this node to hold and that is ready; and, for
// Events, what failed. Images on the node that no spec asks for are not
// warmfleet's to announce.
func warmState(caches []api.CacheStatus, images []api.ImageStatus) nodelabels.State {
	s := nodelabels.State{Models: map[string]string{}, Images: map[string]string{},
		FailedModels: map[string]string{}, FailedImages: map[string]string{}}
	for _, c := range caches {
		switch {
		case c.Ready && c.State == api.StateReady:
			s.Models[c.Name] = c.RevisionID
		case c.State == api.StateFailed:
			s.FailedModels[c.Name] = c.Error
		}
	}
	for _, im := range images {
		if len(im.Wanted) == 0 {
			continue
		}
		switch im.State {
		case string(imagecache.StateReady):
			s.Images[im.Ref] = im.Digest
		case string(imagecache.StateFailed):
			s.FailedImages[im.Ref] = im.Error
		}
	}
	return s
}

func sameState(a, b nodelabels.State) bool {
	return maps.Equal(a.Models, b.Models) && maps.Equal(a.Images, b.Images) &&
		maps.Equal(a.FailedModels, b.FailedModels) && maps.Equal(a.FailedImages, b.FailedImages)
}
