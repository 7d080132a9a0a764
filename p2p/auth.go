package p2p

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"
)

// ClusterKeySize is the length of the shared secret every member holds.
const ClusterKeySize = 32

// ErrUnauthenticated is returned when the other side does not prove it holds
// the cluster key.
var ErrUnauthenticated = errors.New("p2p: peer failed authentication")

// auth turns a fresh TCP connection into an authenticated one and learns
// who the remote node is: the node ID it proved with its identity key.
// Nothing else is read or written before it succeeds.
type auth struct {
	nodeID string
	// keys returns the cluster keys, the one to dial with first; every one
	// is accepted from a dialer, so a fleet can rotate its key (install,
	// use, remove) without connections failing between nodes that switched
	// and nodes that have not yet.
	keys    func() [][]byte
	tlsConf *tls.Config // nil: plaintext after the handshake
	// priv is this node's identity key; the handshake signs with it.
	priv ed25519.PrivateKey
	// trust decides whether a peer that proved an identity is the node it
	// names (nil: any proven identity is taken).
	trust func(peerIdentity) error
	// derived holds the HMAC keys of the keys installed now (see macKeys).
	derived keyCache
}

// keyCache remembers the HMAC keys and IDs derived from the cluster keys
// installed at the last handshake, so an acceptor does not run HKDF for
// every installed key on every connection (a stranger's included) nor a
// dialer on every dial. The derivation depends on nothing but the key, so
// a cached one is the one a fresh derivation would give; the cache follows
// the keyring exactly (any change derives the new set and forgets the old),
// and so holds no key that has been removed.
type keyCache struct {
	mu   sync.Mutex
	from [][]byte // the cluster keys of out, copied
	out  []derivedKey
	// derive is macKey; tests count its calls.
	derive func(clusterKey []byte) []byte
}

// derivedKey is a cluster key's HMAC key and the ID that names it in the
// handshake; mac is nil for a key of the wrong size, which is never used.
type derivedKey struct {
	mac, id []byte
}

// macKeys returns the derived keys of ks, in order.
func (c *keyCache) macKeys(ks [][]byte) []derivedKey {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sameKeys(c.from, ks) {
		return c.out
	}
	derive := c.derive
	if derive == nil {
		derive = macKey
	}
	from, out := make([][]byte, len(ks)), make([]derivedKey, len(ks))
	for i, k := range ks {
		from[i] = bytes.Clone(k)
		if len(k) == ClusterKeySize {
			mk := derive(k)
			out[i] = derivedKey{mac: mk, id: keyID(mk)}
		}
	}
	c.from, c.out = from, out
	return out
}

// sameKeys reports whether a and b are the same keys in the same order,
// in time that does not depend on where they differ.
func sameKeys(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	same := 1
	for i := range a {
		same &= subtle.ConstantTimeCompare(a[i], b[i])
	}
	return same == 1
}

const tlsServerName = "warmfleet-p2p"

// newAuth builds the handshake of node nodeID, with a fresh identity key
// and no trust rule: the caller sets priv and trust to its own.
func newAuth(nodeID string, keys func() [][]byte, encrypt bool) (*auth, error) {
	ks := keys()
	if len(ks) == 0 {
		return nil, errors.New("p2p: no cluster key")
	}
	for _, k := range ks {
		if len(k) != ClusterKeySize {
			return nil, fmt.Errorf("p2p: cluster key must be %d bytes, got %d", ClusterKeySize, len(k))
		}
	}
	if !validName(nodeID) || len(nodeID) > 255 {
		return nil, errors.New("p2p: node id must be 1-255 bytes of UTF-8")
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	a := &auth{nodeID: nodeID, keys: keys, priv: priv}
	if encrypt {
		if a.tlsConf, err = sessionTLS(nodeID); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// macKey derives the HMAC key of a cluster key, and keyID names it in the
// handshake so the acceptor knows which of its keys the dialer uses.
func macKey(clusterKey []byte) []byte {
	k, _ := hkdf.Key(sha256.New, clusterKey, nil, "warmfleet p2p hmac v1", 32)
	return k
}

func keyID(mk []byte) []byte {
	h := hmac.New(sha256.New, mk)
	h.Write([]byte("key id"))
	return h.Sum(nil)[:8]
}

// dialKey returns the HMAC key to dial with, the first cluster key's, and
// its ID.
func (a *auth) dialKey() (mac, id []byte, err error) {
	ks := a.derived.macKeys(a.keys())
	if len(ks) == 0 || ks[0].mac == nil {
		return nil, nil, errors.New("p2p: no usable cluster key")
	}
	return ks[0].mac, ks[0].id, nil
}

// acceptKey returns the HMAC key among ours whose ID is id, or nil.
func (a *auth) acceptKey(id []byte) []byte {
	for _, k := range a.derived.macKeys(a.keys()) {
		if k.mac != nil && hmac.Equal(k.id, id) {
			return k.mac
		}
	}
	return nil
}

// sessionTLS is TLS 1.3 with a throwaway self-signed certificate that
// neither side verifies: TLS here only encrypts. Who is at the other end is
// proven by the handshake that runs inside it, whose transcript both sides
// sign and MAC together with the session's exported keying material, so a
// man in the middle, which ends two different sessions, cannot pass it on.
// Authenticating in the inner handshake rather than by a CA derived from
// the cluster key lets encrypted connections follow a key rotation as the
// handshake does (any installed key is accepted), without a restart.
func sessionTLS(nodeID string) (*tls.Config, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: tls key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, fmt.Errorf("p2p: serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: nodeID},
		DNSNames:     []string{tlsServerName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, pub, priv)
	if err != nil {
		return nil, fmt.Errorf("p2p: tls certificate: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}},
		ServerName:   tlsServerName,
		// The inner handshake authenticates both ends and binds the
		// session (see above); a certificate check would add nothing.
		InsecureSkipVerify: true,
	}, nil
}
