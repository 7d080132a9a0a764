package podendpoints

import (
	"errors"
	"io"
	"os"
	"slices"
	"testing"
	"testing/synctest"

	"gopkg.in/yaml.v3"
	"k8s.io/client-go/kubernetes/fake"
)

// TestRBACIsLeastPrivilege checks deploy/kubernetes/rbac-pod-endpoints.yaml
// against the calls a Watcher makes over all namespaces: every call is
// granted, and every grant is used.
func TestRBACIsLeastPrivilege(t *testing.T) {
	f, err := os.Open("../../../deploy/kubernetes/rbac-pod-endpoints.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	granted := map[string]bool{} // "verb resource"
	dec := yaml.NewDecoder(f)
	for {
		var d struct {
			Kind  string
			Rules []struct {
				APIGroups []string `yaml:"apiGroups"`
				Resources []string
				Verbs     []string
			}
		}
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if d.Kind == "Role" {
			t.Error("rbac-pod-endpoints.yaml has a Role: the file is for all namespaces, a ClusterRole")
		}
		if d.Kind != "ClusterRole" {
			continue
		}
		for _, r := range d.Rules {
			if !slices.Equal(r.APIGroups, []string{""}) {
				t.Errorf("grants API groups %v, want only core", r.APIGroups)
			}
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					granted[v+" "+res] = true
				}
			}
		}
	}
	used := map[string]bool{}
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newPod("a", "10.0.0.1", port("8000")))
		start(t, cs, nil)
		synctest.Wait()
		for _, a := range cs.Actions() {
			if a.GetNamespace() != "" {
				t.Errorf("%s in namespace %q: the file's watcher watches all", a.GetVerb(), a.GetNamespace())
			}
			used[a.GetVerb()+" "+a.GetResource().Resource] = true
		}
	})
	for k := range used {
		if !granted[k] {
			t.Errorf("the watcher calls %q, which rbac-pod-endpoints.yaml does not grant", k)
		}
	}
	for k := range granted {
		if !used[k] {
			t.Errorf("rbac-pod-endpoints.yaml grants %q, which the watcher never uses", k)
		}
	}
}
