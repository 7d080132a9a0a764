// Package kube connects the daemon to the Kubernetes API server of the
// cluster it runs in, when it runs in one. Only in-cluster configuration is
// supported: the daemon runs as a DaemonSet pod with a service account
// whose token the kubelet mounts.
//
// The client speaks core/v1 only, through a REST client with a scheme of
// its own: client-go's typed clientset registers every API group, which
// would link dozens of them into the daemon for the three resources it
// uses (Nodes, Events, Pods).
package kube

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// InCluster reports whether the process runs in a Kubernetes pod: the
// kubelet sets KUBERNETES_SERVICE_HOST in every container.
func InCluster() bool {
	return os.Getenv("KUBERNETES_SERVICE_HOST") != ""
}

// Config returns the in-cluster client config when the process runs in a
// pod or force is set (the --kubernetes flag), and nil, nil otherwise. With
// force outside a pod it fails instead of quietly labeling nothing.
func Config(force bool) (*rest.Config, error) {
	if !force && !InCluster() {
		return nil, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes in-cluster config: %w", err)
	}
	cfg.UserAgent = "warmfleet"
	return cfg, nil
}

// Client calls the core/v1 API: Nodes and Events.
type Client struct{ rc *rest.RESTClient }

// codecs is built on first use: a daemon outside Kubernetes does not pay
// for the scheme's memory.
var scheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		panic(err) // a static registration: fails in every test or never
	}
	return s
})

func codecs() serializer.CodecFactory { return serializer.NewCodecFactory(scheme()) }

// parameterCodec turns ListOptions into a request's query.
func parameterCodec() runtime.ParameterCodec { return runtime.NewParameterCodec(scheme()) }

// NewClient returns a core/v1 client for cfg.
func NewClient(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = codecs().WithoutConversion()
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &Client{rc: rc}, nil
}

// CoreV1 returns a client for the cluster, or nil, nil outside one (see
// Config).
func CoreV1(force bool) (*Client, error) {
	cfg, err := Config(force)
	if cfg == nil || err != nil {
		return nil, err
	}
	return NewClient(cfg)
}

// Nodes is the Node API (nodelabels.Nodes).
func (c *Client) Nodes() Nodes { return Nodes{c.rc} }

// Events is the Event API of one namespace (nodelabels.Events).
func (c *Client) Events(namespace string) Events { return Events{c.rc, namespace} }

// Nodes gets and patches Nodes.
type Nodes struct{ rc *rest.RESTClient }

// Get reads a Node.
func (n Nodes) Get(ctx context.Context, name string, _ metav1.GetOptions) (*corev1.Node, error) {
	out := &corev1.Node{}
	err := n.rc.Get().Resource("nodes").Name(name).Do(ctx).Into(out)
	return out, err
}

// Patch patches a Node; only opts.FieldManager is sent.
func (n Nodes) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*corev1.Node, error) {
	out := &corev1.Node{}
	req := n.rc.Patch(pt).Resource("nodes").Name(name).SubResource(sub...).Body(data)
	if opts.FieldManager != "" {
		req = req.Param("fieldManager", opts.FieldManager)
	}
	err := req.Do(ctx).Into(out)
	return out, err
}

// Events creates Events.
type Events struct {
	rc *rest.RESTClient
	ns string
}

// Create records an Event.
func (e Events) Create(ctx context.Context, ev *corev1.Event, _ metav1.CreateOptions) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := e.rc.Post().Namespace(e.ns).Resource("events").Body(ev).Do(ctx).Into(out)
	return out, err
}

// Pods is the Pod API of one namespace, or of all for ""
// (podendpoints.Pods).
func (c *Client) Pods(namespace string) Pods { return Pods{c.rc, namespace} }

// Pods lists and watches Pods.
type Pods struct {
	rc *rest.RESTClient
	ns string
}

// List lists Pods.
func (p Pods) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	err := p.rc.Get().Namespace(p.ns).Resource("pods").VersionedParams(&opts, parameterCodec()).Do(ctx).Into(out)
	return out, err
}

// Watch watches Pods; opts.TimeoutSeconds also bounds the request.
func (p Pods) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	req := p.rc.Get().Namespace(p.ns).Resource("pods").VersionedParams(&opts, parameterCodec())
	if opts.TimeoutSeconds != nil {
		req = req.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
	}
	return req.Watch(ctx)
}
