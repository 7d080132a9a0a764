// Package podendpoints finds the inference servers running in pods on the
// daemon's own Kubernetes Node, so the daemon registers them as endpoints
// with no `warmfleet endpoint add`. A pod opts in with annotations:
//
//	metadata:
//	  annotations:
//	    warmfleet.io/endpoint-port: "8000"     # or a container port's name, e.g. "http"
//	    warmfleet.io/model: llama-3-8b          # optional: else GET /v1/models is asked
//	    warmfleet.io/speed: "2"                 # optional: twice the usual backend's speed (routers weigh its share)
//
// # Which pods, when
//
// The Watcher lists the pods whose spec.nodeName is the daemon's Node (a
// field selector: the API server sends no other node's pods), in one
// namespace or all, then watches them from the list's resource version.
// A pod is an endpoint, http://<pod IP>:<port>, while it is Running, not
// terminating, has an IP and its Ready condition is true: a pod that fails
// its readiness probe, is being deleted or is deleted leaves the set with
// the watch event that says so. Only this node's pods: an endpoint belongs
// to the fleet member whose node runs it, and the router sends a model's
// requests only to members that hold the model ready, so a pod can only be
// registered by the daemon beside it.
//
// # Annotations are outside input
//
// Anyone who may create a pod may write them. A port that is not 1-65535
// or names no TCP container port, a model name the fleet could never
// cache, or a speed that is not a number in 1/64..64, makes the pod Invalid: it gets no endpoint, the error (the
// value quoted, cut at 64 bytes) is logged and counted once per pod and
// value in warmfleet_pod_endpoint_rejects_total, and
// warmfleet_pod_endpoints{state="invalid"} counts such pods. A server
// that claims a model its node does not hold is registered but gets no
// traffic until the node holds it, as for any endpoint.
//
// # Staying in step
//
// A watch the server closes (its timeout, WatchTimeout) resumes from the
// last resource version seen, bookmarks included; one whose version is
// too old (410 Gone, Expired) lists again. A failed list or watch is
// logged, counted (warmfleet_pod_lists_total{result},
// warmfleet_pod_watch_restarts_total{reason}) and retried after a backoff
// that doubles from MinBackoff to MaxBackoff with up to half taken off at
// random. Every Resync it lists again, mending an event lost anywhere.
// Until the first list succeeds the set is not known (Endpoints says so):
// a daemon that restarts while the API server is away keeps the endpoints
// it registered.
//
// # Permissions
//
// list and watch on pods: a Role in the namespace watched or, for all
// namespaces, a ClusterRole. The Helm chart renders the one that fits
// daemon.podEndpoints (deploy/helm/warmfleet/templates/rbac.yaml);
// TestRBACIsLeastPrivilege checks deploy/kubernetes/rbac-pod-endpoints.yaml
// against the watcher's calls.
package podendpoints
