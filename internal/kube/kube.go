// Package kube connects the daemon to the Kubernetes API server of the
// cluster it runs in, when it runs in one. Only in-cluster configuration is
// supported: the daemon runs as a DaemonSet pod with a service account
// whose token the kubelet mounts.
//
// Only the core/v1 client is built: the full clientset would link every API
// group into the daemon for the two resources it uses (Nodes, Events).
package kube

import (
	"fmt"
	"os"

	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
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

// CoreV1 returns a core/v1 client for the cluster (Nodes(), Events(ns)), or
// nil, nil outside one (see Config).
func CoreV1(force bool) (corev1client.CoreV1Interface, error) {
	cfg, err := Config(force)
	if cfg == nil || err != nil {
		return nil, err
	}
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
}
