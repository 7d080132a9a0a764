package daemon

import (
	"context"
	"slices"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/spec"
)

// Fleet is what the daemon needs from fleet membership (gossip.Node).
type Fleet interface {
	LocalName() string
	Members() []gossip.Member
	SetLocalInventory(gossip.Inventory) error
	OnChange() <-chan struct{}
}

// targeter returns whether a spec targets this node, deciding on one view
// of the fleet. Without a fleet the node is alone: a selector must match its
// labels.
func (d *Daemon) targeter() func(spec.Spec) bool {
	if d.fleet == nil {
		return func(s spec.Spec) bool { return s.Targets.Matches(d.cfg.Labels) }
	}
	members, self := d.fleet.Members(), d.fleet.LocalName()
	return func(s spec.Spec) bool { return slices.Contains(gossip.Targets(s, members), self) }
}

func (d *Daemon) members() []gossip.Member {
	if d.fleet == nil {
		return nil
	}
	return d.fleet.Members()
}

// inventory describes what this node holds, for the fleet.
func (d *Daemon) inventory() (gossip.Inventory, error) {
	recs, err := d.state.records()
	if err != nil {
		return gossip.Inventory{}, err
	}
	eps, err := d.state.endpoints()
	if err != nil {
		return gossip.Inventory{}, err
	}
	inv := gossip.Inventory{Models: map[string]gossip.ModelInventory{}, Labels: d.cfg.Labels}
	d.mu.Lock()
	for name, rec := range recs {
		m := gossip.ModelInventory{Revision: rec.RevisionID, State: inventoryState(rec.State), BytesDone: rec.BytesDone, BytesTotal: rec.BytesTotal}
		if f := d.fetches[name]; f != nil && rec.State != api.StateReady {
			m.BytesDone = f.progress()
		}
		if rec.State == api.StateReady {
			m.Path, m.BytesDone = rec.Path, rec.BytesTotal
		}
		inv.Models[name] = m
	}
	d.mu.Unlock()
	for _, ep := range eps {
		inv.Endpoints = append(inv.Endpoints, gossip.Endpoint{Model: ep.Model, URL: ep.URL, Speed: ep.Speed})
	}
	inv.Images = d.imageInventory()
	inv.S3Bytes = d.metrics.s3Bytes.Load()
	if d.swarm != nil {
		st := d.swarm.p2p.Stats()
		inv.PeerBytesIn, inv.PeerBytesOut = st.PeerBytesIn, st.PeerBytesOut
	}
	if sp, err := d.store.Space(); err == nil {
		inv.DiskFreeBytes, inv.DiskTotalBytes = max(0, sp.Free-d.store.Reserve(sp)), sp.Total
	}
	return inv, nil
}

func inventoryState(s string) gossip.State {
	switch s {
	case api.StateReady:
		return gossip.StateReady
	case api.StateFailed, api.StateInsufficientSpace:
		return gossip.StateFailed
	case api.StateDownloading, api.StateVerifying:
		return gossip.StateDownloading
	default:
		return gossip.StatePending
	}
}

func (d *Daemon) publishInventory() {
	if d.fleet == nil {
		return
	}
	inv, err := d.inventory()
	if err == nil {
		err = d.fleet.SetLocalInventory(inv)
	}
	if err != nil {
		d.log.Error("publish inventory", "err", err)
	}
}

// nodeStatuses is a model's state on every member that reports it.
func nodeStatuses(name string, members []gossip.Member) []api.NodeCacheStatus {
	var out []api.NodeCacheStatus
	for _, m := range members {
		if m.Inventory == nil {
			continue
		}
		if mi, ok := m.Inventory.Models[name]; ok {
			out = append(out, api.NodeCacheStatus{
				Node: m.Name, State: string(mi.State), Ready: mi.State == gossip.StateReady,
				RevisionID: mi.Revision, BytesDone: mi.BytesDone, BytesTotal: mi.BytesTotal,
			})
		}
	}
	return out
}

// Fleet reports the fleet as this daemon sees it.
func (d *Daemon) Fleet() api.Fleet {
	if d.fleet == nil {
		self := api.Member{Name: d.cfg.NodeName, State: "alive", Role: string(gossip.RoleNode), Self: true, Labels: d.cfg.Labels, Version: d.cfg.Version}
		if inv, err := d.inventory(); err == nil {
			fillInventory(&self, &inv)
		}
		return api.Fleet{Members: []api.Member{self}}
	}
	var out []api.Member
	for _, m := range d.fleet.Members() {
		am := api.Member{
			Name: m.Name, Addr: m.Addr, State: string(m.State), Role: string(m.Role), Self: m.Self, Labels: m.Labels,
			Zone: m.Meta.Zone, Version: m.Meta.Version, APIAddr: m.Meta.APIAddr, PeerAddr: m.Meta.PeerAddr,
			InventoryVersion: m.InventoryVersion, LastUpdate: m.LastUpdate,
		}
		fillInventory(&am, m.Inventory)
		out = append(out, am)
	}
	return api.Fleet{Clustered: true, Members: out}
}

func fillInventory(m *api.Member, inv *gossip.Inventory) {
	if inv == nil {
		return
	}
	m.FreeBytes, m.TotalBytes = inv.DiskFreeBytes, inv.DiskTotalBytes
	m.S3Bytes, m.PeerBytesIn, m.PeerBytesOut = inv.S3Bytes, inv.PeerBytesIn, inv.PeerBytesOut
	for name, mi := range inv.Models {
		if m.Models == nil {
			m.Models = map[string]api.MemberModel{}
		}
		m.Models[name] = api.MemberModel{Revision: mi.Revision, State: string(mi.State), BytesDone: mi.BytesDone, BytesTotal: mi.BytesTotal}
	}
	for ref, ii := range inv.Images {
		if m.Images == nil {
			m.Images = map[string]api.MemberModel{}
		}
		m.Images[ref] = api.MemberModel{Revision: ii.Digest, State: string(ii.State), BytesDone: ii.BytesDone, BytesTotal: ii.BytesTotal}
	}
	for _, ep := range inv.Endpoints {
		m.Endpoints = append(m.Endpoints, api.Endpoint{Model: ep.Model, URL: ep.URL, Speed: ep.Speed})
	}
}

// AddEndpoint registers an inference endpoint on this node.
func (d *Daemon) AddEndpoint(_ context.Context, ep api.Endpoint) error {
	if err := ep.Validate(); err != nil {
		return err
	}
	if err := d.state.putEndpoint(ep); err != nil {
		return err
	}
	d.publishInventory()
	return nil
}

// RemoveEndpoint unregisters an endpoint; found is false if it was unknown.
func (d *Daemon) RemoveEndpoint(_ context.Context, url string) (bool, error) {
	found, err := d.state.deleteEndpoint(url)
	if err == nil && found {
		d.publishInventory()
	}
	return found, err
}

// Endpoints lists this node's endpoints.
func (d *Daemon) Endpoints() ([]api.Endpoint, error) { return d.state.endpoints() }
