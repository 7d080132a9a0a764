// Package fleet feeds the router with the inference endpoints the fleet's
// nodes register, learned from gossip: an endpoint gets traffic only while
// its node is alive and has the endpoint's model ready in its cache, and a
// new one ramps up gradually (router.StaticSource does the ramp).
package fleet

import (
	"context"
	"maps"
	"slices"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/router"
)

// Members is what the source needs from a gossip member (gossip.Node).
type Members interface {
	Members() []gossip.Member
	OnChange() <-chan struct{}
}

// Source is a router.EndpointSource backed by fleet inventories, plus
// endpoints configured statically.
type Source struct {
	*router.StaticSource
	members  Members
	static   func() []router.Endpoint
	onChange func([]gossip.Member)
}

// New returns a source of the endpoints m knows now; Run keeps it up to
// date. static, if not nil, returns the configured endpoints to serve
// alongside the fleet's. onChange, if not nil, is also given the members
// now and, while Run runs, after every change (m's change channel has one
// consumer: Run).
func New(m Members, static func() []router.Endpoint, onChange func([]gossip.Member)) *Source {
	if static == nil {
		static = func() []router.Endpoint { return nil }
	}
	if onChange == nil {
		onChange = func([]gossip.Member) {}
	}
	s := &Source{members: m, static: static, onChange: onChange}
	s.StaticSource = router.NewStaticSource(s.current(), nil)
	onChange(m.Members())
	return s
}

// Run follows the fleet's changes until ctx ends.
func (s *Source) Run(ctx context.Context) error {
	changed := s.members.OnChange()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			s.Refresh()
			s.onChange(s.members.Members())
		}
	}
}

// RouterPeers lists the peer-event URLs of the other alive routers that
// advertise one (Meta.PeerAddr), sorted.
func RouterPeers(members []gossip.Member) []string {
	var out []string
	for _, m := range members {
		if m.Role == gossip.RoleRouter && m.State == gossip.MemberAlive && !m.Self && m.Meta.PeerAddr != "" {
			out = append(out, "http://"+m.Meta.PeerAddr)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Refresh recomputes the endpoints (after a configuration reload).
func (s *Source) Refresh() { s.Set(s.current()) }

func (s *Source) current() []router.Endpoint {
	return append(s.static(), Endpoints(s.members.Members())...)
}

// Endpoints lists the endpoints registered on alive node members, one per
// URL with every model it serves. Ready and HoldsWeights both mean that the
// node has every one of the endpoint's models ready in its cache: the
// router sends traffic only there.
func Endpoints(members []gossip.Member) []router.Endpoint {
	byURL := map[string]*router.Endpoint{}
	for _, m := range members {
		if m.Role != gossip.RoleNode || m.State != gossip.MemberAlive || m.Inventory == nil {
			continue
		}
		for _, ep := range m.Inventory.Endpoints {
			ready := m.Inventory.Models[ep.Model].State == gossip.StateReady
			e, ok := byURL[ep.URL]
			if !ok {
				e = &router.Endpoint{URL: ep.URL, Node: m.Name, Ready: true, HoldsWeights: true}
				byURL[ep.URL] = e
			}
			if !slices.Contains(e.Models, ep.Model) {
				e.Models = append(e.Models, ep.Model)
			}
			// One engine serves every model registered at its URL: the
			// fastest speed any registration gives stands for it, so the
			// outcome does not depend on the members' order.
			e.Speed = max(e.Speed, ep.Speed)
			e.Ready = e.Ready && ready
			e.HoldsWeights = e.HoldsWeights && ready
		}
	}
	out := make([]router.Endpoint, 0, len(byURL))
	for _, url := range slices.Sorted(maps.Keys(byURL)) {
		e := byURL[url]
		slices.Sort(e.Models)
		out = append(out, *e)
	}
	return out
}
