package fleet

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/router"
)

func member(name string, state gossip.MemberState, models map[string]gossip.State, eps ...gossip.Endpoint) gossip.Member {
	inv := &gossip.Inventory{Models: map[string]gossip.ModelInventory{}, Endpoints: eps}
	for m, s := range models {
		inv.Models[m] = gossip.ModelInventory{State: s}
	}
	return gossip.Member{Name: name, State: state, Role: gossip.RoleNode, Inventory: inv}
}

func TestEndpoints(t *testing.T) {
	ready := map[string]gossip.State{"llama": gossip.StateReady}
	downloading := map[string]gossip.State{"llama": gossip.StateDownloading}
	members := []gossip.Member{
		member("n1", gossip.MemberAlive, ready, gossip.Endpoint{Model: "llama", URL: "http://10.0.0.1:8000"}),
		member("n2", gossip.MemberAlive, downloading, gossip.Endpoint{Model: "llama", URL: "http://10.0.0.2:8000"}),
		member("n3", gossip.MemberDead, ready, gossip.Endpoint{Model: "llama", URL: "http://10.0.0.3:8000"}),
		{Name: "router", State: gossip.MemberAlive, Role: gossip.RoleRouter, Inventory: &gossip.Inventory{Endpoints: []gossip.Endpoint{{Model: "llama", URL: "http://evil:1"}}}},
		member("n4", gossip.MemberAlive, map[string]gossip.State{"llama": gossip.StateReady, "qwen": gossip.StateReady},
			gossip.Endpoint{Model: "qwen", URL: "http://10.0.0.4:8000"}, gossip.Endpoint{Model: "llama", URL: "http://10.0.0.4:8000", Speed: 2}),
	}
	got := Endpoints(members)
	if len(got) != 3 {
		t.Fatalf("got %d endpoints, want 3 (dead node and router member left out): %+v", len(got), got)
	}
	byURL := map[string]int{}
	for i, e := range got {
		byURL[e.URL] = i
	}
	if e := got[byURL["http://10.0.0.1:8000"]]; !e.Ready || !e.HoldsWeights || e.Node != "n1" {
		t.Errorf("ready node's endpoint: %+v", e)
	}
	if e := got[byURL["http://10.0.0.2:8000"]]; e.Ready || e.HoldsWeights {
		t.Errorf("endpoint of a node still downloading gets traffic: %+v", e)
	}
	if e := got[byURL["http://10.0.0.4:8000"]]; !e.Ready || len(e.Models) != 2 || e.Models[0] != "llama" || e.Speed != 2 {
		t.Errorf("two-model endpoint, one registration with speed 2: %+v", e)
	}
	if e := got[byURL["http://10.0.0.1:8000"]]; e.Speed != 0 {
		t.Errorf("endpoint registered without a speed: %+v", e)
	}
}

type fakeMembers struct {
	members []gossip.Member
	changed chan struct{}
}

func (f *fakeMembers) Members() []gossip.Member  { return f.members }
func (f *fakeMembers) OnChange() <-chan struct{} { return f.changed }

func TestRunFollowsChanges(t *testing.T) {
	defer goleak.VerifyNone(t)
	fm := &fakeMembers{changed: make(chan struct{}, 1)}
	s := New(fm, func() []router.Endpoint { return []router.Endpoint{{URL: "http://static:1", Ready: true}} }, nil)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	defer func() {
		stop()
		if err := <-ran; err != nil {
			t.Error(err)
		}
	}()
	eps, changed := s.Endpoints()
	if len(eps) != 1 || eps[0].URL != "http://static:1" {
		t.Fatalf("initial endpoints %+v", eps)
	}
	fm.members = []gossip.Member{member("n1", gossip.MemberAlive, map[string]gossip.State{"m": gossip.StateReady}, gossip.Endpoint{Model: "m", URL: "http://n1:8000"})}
	fm.changed <- struct{}{}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("source did not follow the fleet")
	}
	if eps, _ = s.Endpoints(); len(eps) != 2 || !eps[1].Ready || eps[1].URL != "http://n1:8000" {
		t.Fatalf("endpoints after change: %+v", eps)
	}
}

func TestRouterPeers(t *testing.T) {
	router := func(name string, state gossip.MemberState, peerAddr string, self bool) gossip.Member {
		return gossip.Member{Name: name, State: state, Role: gossip.RoleRouter, Meta: gossip.Meta{PeerAddr: peerAddr}, Self: self}
	}
	node := member("n1", gossip.MemberAlive, nil)
	node.Meta.PeerAddr = "10.0.0.1:7947" // a daemon's swarm address, not a router's
	got := RouterPeers([]gossip.Member{
		router("r3", gossip.MemberAlive, "10.0.1.3:9181", false),
		router("r1", gossip.MemberAlive, "10.0.1.1:9181", true), // this router
		router("r2", gossip.MemberAlive, "10.0.1.2:9181", false),
		router("r4", gossip.MemberDead, "10.0.1.4:9181", false),
		router("r5", gossip.MemberAlive, "", false), // takes no peer streams
		router("r6", gossip.MemberAlive, "10.0.1.2:9181", false),
		node,
	})
	want := []string{"http://10.0.1.2:9181", "http://10.0.1.3:9181"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("RouterPeers = %v, want %v", got, want)
	}
}
