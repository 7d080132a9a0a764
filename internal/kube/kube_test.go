package kube

import (
	"errors"
	"os"
	"testing"

	"k8s.io/client-go/rest"
)

func TestOutsideCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if InCluster() {
		t.Fatal("InCluster with KUBERNETES_SERVICE_HOST empty")
	}
	c, err := CoreV1(false)
	if c != nil || err != nil {
		t.Fatalf("CoreV1(false) outside a cluster = %v, %v; want nil, nil", c, err)
	}
	// --kubernetes outside a pod is an error, not a silent no-op.
	if _, err := Config(true); !errors.Is(err, rest.ErrNotInCluster) {
		t.Fatalf("Config(true) outside a cluster: %v, want %v", err, rest.ErrNotInCluster)
	}
}

// TestInClusterWithoutToken runs where the kubelet would have mounted a
// service account token but did not (automountServiceAccountToken: false):
// the error says so instead of the daemon running unlabeled.
func TestInClusterWithoutToken(t *testing.T) {
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		t.Skip("this machine has a service account token")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	if !InCluster() {
		t.Fatal("not InCluster with KUBERNETES_SERVICE_HOST set")
	}
	_, err := CoreV1(false)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CoreV1 without a token: %v, want a missing-file error", err)
	}
}
