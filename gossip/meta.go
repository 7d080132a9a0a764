package gossip

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/hashicorp/memberlist"
)

// Role is what a member does in the fleet.
type Role string

// Member roles.
const (
	RoleNode   Role = "node"   // a daemon that caches and serves
	RoleRouter Role = "router" // a router that only watches the fleet
)

func (r Role) valid() bool { return r == RoleNode || r == RoleRouter }

// Meta is the small, rarely changing part of a member: it rides in
// memberlist's node metadata (at most 512 bytes), so it holds addresses, not
// inventory.
type Meta struct {
	// APIAddr is the daemon's HTTP API address (host:port).
	APIAddr string
	// PeerAddr is the address of the peer-to-peer swarm (host:port).
	PeerAddr string
	Zone     string
	Version  string
	// PeerKey is the node's p2p identity key (an ed25519 public key), which
	// its swarm handshakes prove. Members pin a name to the first key they
	// see for it (see Node.PeerKey), so a member holding the cluster key
	// cannot pass itself off as another in the swarm.
	PeerKey []byte
}

type wireMeta struct {
	Role     Role   `json:"r"`
	APIAddr  string `json:"a,omitempty"`
	PeerAddr string `json:"p,omitempty"`
	Zone     string `json:"z,omitempty"`
	Version  string `json:"v,omitempty"`
	PeerKey  string `json:"k,omitempty"` // base64, no padding
}

const maxMetaField = 256

func (m Meta) validate() error {
	for _, f := range []struct{ name, v string }{{"API address", m.APIAddr}, {"peer address", m.PeerAddr}, {"zone", m.Zone}, {"version", m.Version}} {
		if len(f.v) > maxMetaField {
			return fmt.Errorf("node metadata: %s is %d bytes, at most %d", f.name, len(f.v), maxMetaField)
		}
	}
	if len(m.PeerKey) != 0 && len(m.PeerKey) != ed25519.PublicKeySize {
		return fmt.Errorf("node metadata: peer key is %d bytes, want %d", len(m.PeerKey), ed25519.PublicKeySize)
	}
	return nil
}

// encodeMeta encodes the node metadata, refusing more than memberlist
// carries.
func encodeMeta(role Role, m Meta) ([]byte, error) {
	if !role.valid() {
		return nil, fmt.Errorf("role %q: want %q or %q", role, RoleNode, RoleRouter)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(wireMeta{Role: role, APIAddr: m.APIAddr, PeerAddr: m.PeerAddr, Zone: m.Zone, Version: m.Version,
		PeerKey: base64.RawStdEncoding.EncodeToString(m.PeerKey)})
	if err != nil {
		return nil, err
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("node metadata is %d bytes, memberlist carries at most %d: shorten the addresses, zone or version", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

// decodeMeta decodes a peer's node metadata.
func decodeMeta(b []byte) (Role, Meta, error) {
	if len(b) > memberlist.MetaMaxSize {
		return "", Meta{}, fmt.Errorf("node metadata of %d bytes exceeds %d", len(b), memberlist.MetaMaxSize)
	}
	var w wireMeta
	if err := json.Unmarshal(b, &w); err != nil {
		return "", Meta{}, fmt.Errorf("node metadata: %w", err)
	}
	if !w.Role.valid() {
		return "", Meta{}, fmt.Errorf("node metadata: role %q: want %q or %q", truncate(string(w.Role)), RoleNode, RoleRouter)
	}
	m := Meta{APIAddr: w.APIAddr, PeerAddr: w.PeerAddr, Zone: w.Zone, Version: w.Version}
	if w.PeerKey != "" {
		k, err := base64.RawStdEncoding.DecodeString(w.PeerKey)
		if err != nil {
			return "", Meta{}, fmt.Errorf("node metadata: peer key: %w", err)
		}
		m.PeerKey = k
	}
	if err := m.validate(); err != nil {
		return "", Meta{}, err
	}
	return w.Role, m, nil
}
