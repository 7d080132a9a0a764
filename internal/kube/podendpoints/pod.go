package podendpoints

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/spec"
)

// The annotations a pod opts in with.
const (
	// AnnotationPort makes a pod an endpoint: the port its
	// OpenAI-compatible server listens on, a number (1-65535) or the name
	// of one of the pod's container ports.
	AnnotationPort = "warmfleet.io/endpoint-port"
	// AnnotationModel, optional, is the model the server serves; without
	// it the server is asked (GET /v1/models).
	AnnotationModel = "warmfleet.io/model"
	// AnnotationSpeed, optional, is the server's prefill and decode speed
	// relative to the fleet's usual backend (1/64..64, e.g. "2" on a GPU
	// twice as fast): routers give it that many times the traffic share.
	AnnotationSpeed = "warmfleet.io/speed"
)

// State is where an annotated pod stands, the values of the state label of
// warmfleet_pod_endpoints.
type State string

// The states of an annotated pod.
const (
	// Ready: running, its Ready condition true, an IP: an endpoint.
	Ready State = "ready"
	// NotReady: starting, failing its readiness probe, terminating or
	// done: no endpoint until it is ready again.
	NotReady State = "not_ready"
	// Invalid: its annotations cannot make an endpoint (the error says
	// why); no endpoint until they are fixed.
	Invalid State = "invalid"
)

// Endpoint is a ready pod's server.
type Endpoint struct {
	// URL is http://<pod IP>:<port>.
	URL string
	// Model is AnnotationModel's value; empty means ask the server.
	Model string
	// Speed is AnnotationSpeed's value; 0 when not annotated.
	Speed float64
	// Pod is namespace/name, for logs.
	Pod string
}

// maxShown bounds how much of a hostile annotation an error quotes.
const maxShown = 64

// FromPod decides what a pod is to the discovery: ok is false for a pod
// without AnnotationPort or on another node (none of its business);
// otherwise the pod's State and, when Ready, its Endpoint. An Invalid
// pod's err says which annotation is wrong and why. Annotations are
// anyone's input who may create pods: they are checked, never trusted.
func FromPod(pod *corev1.Pod, node string) (ep Endpoint, st State, ok bool, err error) {
	portAnn, annotated := pod.Annotations[AnnotationPort]
	if !annotated || (node != "" && pod.Spec.NodeName != node) {
		return Endpoint{}, "", false, nil
	}
	name := pod.Namespace + "/" + pod.Name
	port, err := resolvePort(pod, portAnn)
	if err != nil {
		return Endpoint{}, Invalid, true, fmt.Errorf("pod %s: %w", name, err)
	}
	model, hasModel := pod.Annotations[AnnotationModel]
	if hasModel {
		if err := spec.ValidateModelName(model); err != nil {
			return Endpoint{}, Invalid, true, fmt.Errorf("pod %s: annotation %s %s: %w", name, AnnotationModel, shown(model), err)
		}
	}
	var speed float64
	if v, ok := pod.Annotations[AnnotationSpeed]; ok {
		if speed, err = strconv.ParseFloat(v, 64); err != nil || !(speed >= 1.0/api.MaxEndpointSpeed && speed <= api.MaxEndpointSpeed) {
			return Endpoint{}, Invalid, true, fmt.Errorf("pod %s: annotation %s %s: want a number 1/%d..%d", name, AnnotationSpeed, shown(v), api.MaxEndpointSpeed, api.MaxEndpointSpeed)
		}
	}
	if !podReady(pod) {
		return Endpoint{}, NotReady, true, nil
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || ip.Zone() != "" {
		return Endpoint{}, NotReady, true, nil
	}
	u := "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(port))
	return Endpoint{URL: u, Model: model, Speed: speed, Pod: name}, Ready, true, nil
}

// resolvePort reads AnnotationPort: a decimal port or a container port's
// name.
func resolvePort(pod *corev1.Pod, v string) (int, error) {
	if v == "" {
		return 0, fmt.Errorf("annotation %s is empty: want a port number or a container port's name", AnnotationPort)
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 || len(v) > 5 {
			return 0, fmt.Errorf("annotation %s %s: want a port 1-65535 or a container port's name", AnnotationPort, shown(v))
		}
		return n, nil
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == v && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) && p.ContainerPort >= 1 && p.ContainerPort <= 65535 {
				return int(p.ContainerPort), nil
			}
		}
	}
	return 0, fmt.Errorf("annotation %s %s: no TCP container port of that name", AnnotationPort, shown(v))
}

// podReady: running, not terminating, its Ready condition true (the
// kubelet's view of the readiness probe and readiness gates).
func podReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// shown quotes at most maxShown bytes of an annotation value for an
// error: a value may be up to the API server's 256 KiB of annotations.
func shown(v string) string {
	if len(v) <= maxShown {
		return strconv.Quote(v)
	}
	cut := v[:maxShown]
	for !utf8.ValidString(cut) {
		cut = cut[:len(cut)-1]
	}
	return strconv.Quote(cut) + fmt.Sprintf("... (%d bytes)", len(v))
}
