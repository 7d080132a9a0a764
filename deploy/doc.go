// Package deploy holds what runs warmfleet on Kubernetes, and the tests that
// keep it working: no Go code ships from here.
//
//   - helm/warmfleet: the Helm 3 chart (daemon DaemonSet, router Deployment,
//     monitoring objects, an example inference Deployment);
//   - kubernetes/warmfleet.yaml: the chart rendered with its default values,
//     for kubectl apply without Helm;
//   - grafana/warmfleet.json: the Grafana dashboard, also in the chart.
//
// The tests run the real helm binary (bin/helm, installed by `make deps`):
// helm lint and helm template with several value sets, every rendered object
// decoded strictly into the Kubernetes API types and checked for what the
// daemon and the router need on a node; the chart's own daemon arguments and
// environment then start daemons on network-namespace hosts
// (integration/netlab) that form a fleet and cache a model. No Kubernetes
// API server runs here: scheduling, the kubelet's volume handling and probes
// are not exercised.
package deploy
