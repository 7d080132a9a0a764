package nodelabels

import (
	"errors"
	"io"
	"os"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"gopkg.in/yaml.v3"
	"k8s.io/client-go/kubernetes/fake"
)

type rbacDoc struct {
	Kind     string
	Metadata struct{ Name, Namespace string }
	Rules    []struct {
		APIGroups []string `yaml:"apiGroups"`
		Resources []string
		Verbs     []string
	}
}

// TestRBACIsLeastPrivilege checks deploy/kubernetes/rbac.yaml against the
// calls a Labeler makes: every call is granted, and every grant is used.
func TestRBACIsLeastPrivilege(t *testing.T) {
	f, err := os.Open("../../../deploy/kubernetes/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	granted := map[string]bool{} // "namespace verb resource"; "" namespace for a ClusterRole
	dec := yaml.NewDecoder(f)
	for {
		var d rbacDoc
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if d.Kind != "Role" && d.Kind != "ClusterRole" {
			continue
		}
		for _, r := range d.Rules {
			if !slices.Equal(r.APIGroups, []string{""}) {
				t.Errorf("%s %s grants API groups %v, want only core", d.Kind, d.Metadata.Name, r.APIGroups)
			}
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					granted[d.Metadata.Namespace+" "+v+" "+res] = true
				}
			}
		}
	}

	used := map[string]bool{}
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(newNode(map[string]string{ModelKey("old"): ReadyValue}, nil))
		l := start(t, cs, func(c *Config) { c.Events = cs.CoreV1().Events(EventNamespace) })
		l.Update(State{})
		synctest.Wait()
		l.Update(State{Models: map[string]string{"a": "r1"}, FailedImages: map[string]string{"x:1": "pull failed"}})
		time.Sleep(time.Minute)
		for _, a := range cs.Actions() {
			used[a.GetNamespace()+" "+a.GetVerb()+" "+a.GetResource().Resource] = true
		}
	})
	for k := range used {
		if !granted[k] {
			t.Errorf("the labeler calls %q, which rbac.yaml does not grant", k)
		}
	}
	for k := range granted {
		if !used[k] {
			t.Errorf("rbac.yaml grants %q, which the labeler never uses", k)
		}
	}
}
