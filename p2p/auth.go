package p2p

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"time"
)

// ClusterKeySize is the length of the shared secret every member holds.
const ClusterKeySize = 32

// ErrUnauthenticated is returned when the other side does not prove it holds
// the cluster key.
var ErrUnauthenticated = errors.New("p2p: peer failed authentication")

// auth turns a fresh TCP connection into an authenticated one and learns the
// remote node's ID. Nothing else is read or written before it succeeds.
type auth struct {
	nodeID string
	// keys returns the cluster keys, the one to dial with first; every one
	// is accepted from a dialer, so a fleet can rotate its key (install,
	// use, remove) without connections failing between nodes that switched
	// and nodes that have not yet.
	keys    func() [][]byte
	tlsConf *tls.Config // nil: HMAC handshake, then plaintext
}

const tlsServerName = "warmfleet-p2p"

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
	a := &auth{nodeID: nodeID, keys: keys}
	if encrypt {
		// TLS pins the CA of the key in use at start: a rotation reaches
		// encrypted connections when the node restarts.
		var err error
		if a.tlsConf, err = clusterTLS(ks[0], nodeID); err != nil {
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

// dialKey returns the HMAC key to dial with: the first cluster key's.
func (a *auth) dialKey() ([]byte, error) {
	ks := a.keys()
	if len(ks) == 0 || len(ks[0]) != ClusterKeySize {
		return nil, errors.New("p2p: no usable cluster key")
	}
	return macKey(ks[0]), nil
}

// acceptKey returns the HMAC key among ours whose ID is id, or nil.
func (a *auth) acceptKey(id []byte) []byte {
	for _, k := range a.keys() {
		if len(k) != ClusterKeySize {
			continue
		}
		if mk := macKey(k); hmac.Equal(keyID(mk), id) {
			return mk
		}
	}
	return nil
}

// clusterTLS derives a CA every member can compute from the cluster key and
// issues this node a certificate under it, for mutual TLS 1.3.
func clusterTLS(clusterKey []byte, nodeID string) (*tls.Config, error) {
	seed, err := hkdf.Key(sha256.New, clusterKey, nil, "warmfleet p2p ca v1", ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("p2p: derive ca: %w", err)
	}
	caKey := ed25519.NewKeyFromSeed(seed)
	// Fixed fields make the CA certificate identical on every node.
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "warmfleet p2p ca"},
		NotBefore:             time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2124, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(nil, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("p2p: ca certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("p2p: ca certificate: %w", err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: node key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, fmt.Errorf("p2p: serial: %w", err)
	}
	now := time.Now()
	leafTmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: nodeID},
		DNSNames:     []string{tlsServerName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(nil, leafTmpl, ca, pub, caKey)
	if err != nil {
		return nil, fmt.Errorf("p2p: node certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: priv}},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ServerName:   tlsServerName,
	}, nil
}

// HMAC handshake (plaintext mode), both sides proving knowledge of the key
// over fresh nonces; distinct labels stop one side's proof being replayed
// as the other's. keyID names which cluster key the dialer uses:
//
//	C->S  "WFP2P2" nonceC[32] keyID[8] len idC
//	S->C  nonceS[32] len idS HMAC("server", nonceC, nonceS, idC, idS)
//	C->S  HMAC("client", nonceC, nonceS, idC, idS)
//	S->C  0x01 (accepted)
var handshakeMagic = []byte("WFP2P2")

func mac(key []byte, label string, nc, ns []byte, idC, idS string) []byte {
	h := hmac.New(sha256.New, key)
	for _, p := range [][]byte{[]byte(label), nc, ns, {byte(len(idC))}, []byte(idC), {byte(len(idS))}, []byte(idS)} {
		h.Write(p)
	}
	return h.Sum(nil)
}

// client authenticates an outgoing connection and returns the connection to
// use (wrapped in TLS when encrypting) and the server's node ID.
func (a *auth) client(c net.Conn, deadline time.Time) (net.Conn, string, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return nil, "", err
	}
	defer func() { _ = c.SetDeadline(time.Time{}) }() // the connection fails its next IO if this did
	if a.tlsConf != nil {
		tc := tls.Client(c, a.tlsConf)
		if err := tc.Handshake(); err != nil {
			return nil, "", fmt.Errorf("%w: %w", ErrUnauthenticated, err)
		}
		return tc, tc.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
	}
	key, err := a.dialKey()
	if err != nil {
		return nil, "", err
	}
	nc := make([]byte, 32)
	_, _ = rand.Read(nc)
	msg := append(append(append(append(append([]byte{}, handshakeMagic...), nc...), keyID(key)...), byte(len(a.nodeID))), a.nodeID...)
	if _, err := c.Write(msg); err != nil {
		return nil, "", fmt.Errorf("p2p: handshake: %w", err)
	}
	ns := make([]byte, 32)
	if _, err := io.ReadFull(c, ns); err != nil {
		return nil, "", fmt.Errorf("p2p: handshake: %w", err)
	}
	idS, err := readShortString(c)
	if err != nil {
		return nil, "", err
	}
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, got); err != nil {
		return nil, "", fmt.Errorf("p2p: handshake: %w", err)
	}
	if !hmac.Equal(got, mac(key, "server", nc, ns, a.nodeID, idS)) {
		return nil, "", ErrUnauthenticated
	}
	if _, err := c.Write(mac(key, "client", nc, ns, a.nodeID, idS)); err != nil {
		return nil, "", fmt.Errorf("p2p: handshake: %w", err)
	}
	ok := make([]byte, 1)
	if _, err := io.ReadFull(c, ok); err != nil || ok[0] != 1 {
		return nil, "", fmt.Errorf("%w: server refused us", ErrUnauthenticated)
	}
	return c, idS, nil
}

// server authenticates an incoming connection.
func (a *auth) server(c net.Conn, deadline time.Time) (net.Conn, string, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return nil, "", err
	}
	defer func() { _ = c.SetDeadline(time.Time{}) }() // the connection fails its next IO if this did
	if a.tlsConf != nil {
		tc := tls.Server(c, a.tlsConf)
		if err := tc.Handshake(); err != nil {
			return nil, "", fmt.Errorf("%w: %w", ErrUnauthenticated, err)
		}
		return tc, tc.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
	}
	hdr := make([]byte, len(handshakeMagic)+32+8)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return nil, "", fmt.Errorf("p2p: handshake: %w", err)
	}
	if !bytes.Equal(hdr[:len(handshakeMagic)], handshakeMagic) {
		return nil, "", fmt.Errorf("%w: not a warmfleet p2p client", ErrUnauthenticated)
	}
	nc := hdr[len(handshakeMagic) : len(handshakeMagic)+32]
	key := a.acceptKey(hdr[len(handshakeMagic)+32:])
	idC, err := readShortString(c)
	if err != nil {
		return nil, "", err
	}
	if key == nil {
		return nil, "", fmt.Errorf("%w: client uses a key we do not hold", ErrUnauthenticated)
	}
	ns := make([]byte, 32)
	_, _ = rand.Read(ns)
	msg := append(append(append(append([]byte{}, ns...), byte(len(a.nodeID))), a.nodeID...), mac(key, "server", nc, ns, idC, a.nodeID)...)
	if _, err := c.Write(msg); err != nil {
		return nil, "", fmt.Errorf("p2p: handshake: %w", err)
	}
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, got); err != nil {
		return nil, "", fmt.Errorf("p2p: handshake: %w", err)
	}
	if !hmac.Equal(got, mac(key, "client", nc, ns, idC, a.nodeID)) {
		return nil, "", ErrUnauthenticated
	}
	if _, err := c.Write([]byte{1}); err != nil {
		return nil, "", fmt.Errorf("p2p: handshake: %w", err)
	}
	return c, idC, nil
}

func readShortString(r io.Reader) (string, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", fmt.Errorf("p2p: handshake: %w", err)
	}
	b := make([]byte, n[0])
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("p2p: handshake: %w", err)
	}
	if !validName(string(b)) {
		return "", fmt.Errorf("%w: bad node id", ErrUnauthenticated)
	}
	return string(b), nil
}
