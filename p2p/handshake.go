package p2p

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// The handshake, version 4, proves two things of each side: that it holds
// a cluster key (an HMAC, as members share the key), and which member it
// is (an ed25519 signature with its identity key). Both cover a transcript
// of the whole exchange: both fresh nonces, both node IDs and identity
// keys, the cluster key's ID, the node the dialer means to reach and, over
// TLS, the TLS session (an exported keying value), so a recorded handshake
// replays nowhere and a member cannot pass another's handshake through as
// its own:
//
//	C->S  "WFP2P4"   nonceC[32] keyID[8] keyC[32] len idC len want
//	S->C  "WFP2P4"   nonceS[32] keyS[32] len idS  macS[32] sigS[64]
//	C->S  macC[32] sigC[64]
//	S->C  0x01 (accepted)
//
//	T    = SHA-256("warmfleet p2p handshake v4", len binding, binding, hello, answer up to idS)
//	mac  = HMAC-SHA-256(hmac key of the cluster key, role, T)
//	sig  = Ed25519(identity key, "warmfleet p2p v4 " role, T, mac)
//
// want is the node ID the dialer expects at the address (empty: any); the
// server refuses one meant for another node, and the dialer one that
// answers under another ID. The version is the character after "WFP2P"
// (version 2 had no identity keys; version 3 had this handshake, but its
// members hung up on a manifest ask held until the shard opens, msgWaitManifest,
// so a fleet mixing the two refuses each other at the handshake, saying why,
// rather than failing asks). A side that speaks another version gets
// "WFP2P" and its own version back before the connection closes, so both
// ends can say which versions met instead of waiting out a timeout.
const handshakeVersion = '4'

var handshakeMagic = []byte("WFP2P")

const (
	nonceSize  = 32
	keyIDSize  = 8
	macSize    = sha256.Size
	headerSize = 6 // magic and version
	proofSize  = macSize + ed25519.SignatureSize
)

// ErrIdentity is returned when a peer proves an identity key other than the
// one its node ID is known by, or is not the node the dialer meant to reach.
var ErrIdentity = errors.New("p2p: peer is not the node it claims")

// ErrVersion is returned when the other side speaks another handshake
// version.
var ErrVersion = errors.New("p2p: peer speaks another handshake version")

// peerIdentity is who a peer proved to be in the handshake.
type peerIdentity struct {
	ID  string
	Key ed25519.PublicKey
}

func (p peerIdentity) String() string { return p.ID + " " + keyString(p.Key) }

// keyString is how an identity key is shown to operators and in logs.
func keyString(k ed25519.PublicKey) string {
	return "ed25519:" + base64.RawURLEncoding.EncodeToString(k)
}

// hello is the dialer's first message.
type hello struct {
	nonce [nonceSize]byte
	keyID [keyIDSize]byte
	key   [ed25519.PublicKeySize]byte
	id    string
	want  string
}

func (h *hello) marshal() []byte {
	b := append(versionHeader(), h.nonce[:]...)
	b = append(b, h.keyID[:]...)
	b = append(b, h.key[:]...)
	b = appendShort(b, h.id)
	return appendShort(b, h.want)
}

// answer is the acceptor's reply; head is what the transcript covers.
type answer struct {
	nonce [nonceSize]byte
	key   [ed25519.PublicKeySize]byte
	id    string
	mac   [macSize]byte
	sig   [ed25519.SignatureSize]byte
}

func (a *answer) head() []byte {
	b := append(versionHeader(), a.nonce[:]...)
	b = append(b, a.key[:]...)
	return appendShort(b, a.id)
}

func versionHeader() []byte { return append(bytes.Clone(handshakeMagic), handshakeVersion) }

func appendShort(b []byte, s string) []byte { return append(append(b, byte(len(s))), s...) }

// readVersion reads and checks the magic and version that start both the
// hello and the answer.
func readVersion(r io.Reader) error {
	var hdr [headerSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	if !bytes.Equal(hdr[:len(handshakeMagic)], handshakeMagic) {
		return fmt.Errorf("%w: not a warmfleet p2p peer", ErrUnauthenticated)
	}
	if v := hdr[len(handshakeMagic)]; v != handshakeVersion {
		return fmt.Errorf("%w: %w: it speaks version %q, this node %q; run one warmfleet version across the fleet", ErrUnauthenticated, ErrVersion, v, handshakeVersion)
	}
	return nil
}

// readHello reads a dialer's hello and returns it with its bytes as sent.
func readHello(r io.Reader) (hello, []byte, error) {
	var h hello
	if err := readVersion(r); err != nil {
		return h, nil, err
	}
	fixed := make([]byte, nonceSize+keyIDSize+ed25519.PublicKeySize)
	if _, err := io.ReadFull(r, fixed); err != nil {
		return h, nil, err
	}
	copy(h.nonce[:], fixed)
	copy(h.keyID[:], fixed[nonceSize:])
	copy(h.key[:], fixed[nonceSize+keyIDSize:])
	var err error
	if h.id, err = readShort(r, false); err != nil {
		return h, nil, err
	}
	if h.want, err = readShort(r, true); err != nil {
		return h, nil, err
	}
	return h, h.marshal(), nil
}

// readAnswer reads an acceptor's answer.
func readAnswer(r io.Reader) (answer, error) {
	var a answer
	if err := readVersion(r); err != nil {
		return a, err
	}
	fixed := make([]byte, nonceSize+ed25519.PublicKeySize)
	if _, err := io.ReadFull(r, fixed); err != nil {
		return a, err
	}
	copy(a.nonce[:], fixed)
	copy(a.key[:], fixed[nonceSize:])
	var err error
	if a.id, err = readShort(r, false); err != nil {
		return a, err
	}
	proof := make([]byte, proofSize)
	if _, err := io.ReadFull(r, proof); err != nil {
		return a, err
	}
	copy(a.mac[:], proof)
	copy(a.sig[:], proof[macSize:])
	return a, nil
}

// readShort reads a length-prefixed node ID (empty only if allowed).
func readShort(r io.Reader, emptyOK bool) (string, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	if n[0] == 0 && emptyOK {
		return "", nil
	}
	b := make([]byte, n[0])
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	if !validName(string(b)) {
		return "", fmt.Errorf("%w: bad node id", ErrUnauthenticated)
	}
	return string(b), nil
}

// transcript hashes everything both sides said, and the TLS session they
// said it in (binding; empty in plaintext).
func transcript(binding, hello, answerHead []byte) []byte {
	h := sha256.New()
	h.Write([]byte("warmfleet p2p handshake v4"))
	h.Write([]byte{byte(len(binding))})
	h.Write(binding)
	h.Write(hello)
	h.Write(answerHead)
	return h.Sum(nil)
}

func signedPart(role string, t, mac []byte) []byte {
	return append(append([]byte("warmfleet p2p v4 "+role), t...), mac...)
}

// prove returns a side's proof of the cluster key (mk, its HMAC key) and
// of its identity over transcript t.
func prove(role string, mk []byte, priv ed25519.PrivateKey, t []byte) (mac [macSize]byte, sig [ed25519.SignatureSize]byte) {
	m := hmac.New(sha256.New, mk)
	m.Write([]byte(role))
	m.Write(t)
	copy(mac[:], m.Sum(nil))
	copy(sig[:], ed25519.Sign(priv, signedPart(role, t, mac[:])))
	return mac, sig
}

// checkProof checks the other side's proof: the HMAC says it holds the
// cluster key, the signature that it holds the identity key it named.
func checkProof(role string, mk []byte, key ed25519.PublicKey, t []byte, mac [macSize]byte, sig [ed25519.SignatureSize]byte) error {
	m := hmac.New(sha256.New, mk)
	m.Write([]byte(role))
	m.Write(t)
	if !hmac.Equal(mac[:], m.Sum(nil)) {
		return fmt.Errorf("%w: wrong cluster key proof", ErrUnauthenticated)
	}
	if !ed25519.Verify(key, signedPart(role, t, mac[:]), sig[:]) {
		return fmt.Errorf("%w: wrong identity signature", ErrUnauthenticated)
	}
	return nil
}

// secure wraps c in TLS when encrypting (as the dialer when client), and
// returns the connection to speak on and the value that ties the handshake
// to that TLS session (nil in plaintext).
func (a *auth) secure(c net.Conn, client bool) (net.Conn, []byte, error) {
	if a.tlsConf == nil {
		return c, nil, nil
	}
	tc := tls.Server(c, a.tlsConf)
	if client {
		tc = tls.Client(c, a.tlsConf)
	}
	if err := tc.Handshake(); err != nil {
		if hungUp(err) {
			// Nothing was proved or disproved: a member shutting down
			// resets the handshakes in flight, and a rolling restart
			// must not look like an attack.
			return nil, nil, fmt.Errorf("p2p: tls handshake: %w", err)
		}
		return nil, nil, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	}
	cs := tc.ConnectionState()
	b, err := cs.ExportKeyingMaterial("EXPORTER-warmfleet-p2p-v4", nil, 32)
	if err != nil {
		return nil, nil, fmt.Errorf("p2p: tls binding: %w", err)
	}
	return tc, b, nil
}

// peerHungUp reports whether err says the other side closed or reset the
// connection.
func peerHungUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// hungUp reports whether err says the connection ended, on either side, or
// timed out, rather than that the other side spoke something else than TLS.
func hungUp(err error) bool {
	var ne net.Error
	return peerHungUp(err) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) || (errors.As(err, &ne) && ne.Timeout())
}

func (a *auth) pub() [ed25519.PublicKeySize]byte {
	var k [ed25519.PublicKeySize]byte
	copy(k[:], a.priv.Public().(ed25519.PublicKey))
	return k
}

func (a *auth) check(p peerIdentity) error {
	if a.trust == nil {
		return nil
	}
	return a.trust(p)
}

// client authenticates an outgoing connection meant for node want (""
// for whichever member answers) and returns the connection to use
// (wrapped in TLS when encrypting) and who the server proved to be.
func (a *auth) client(c net.Conn, deadline time.Time, want string) (net.Conn, peerIdentity, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return nil, peerIdentity{}, err
	}
	defer func() { _ = c.SetDeadline(time.Time{}) }() // the connection fails its next IO if this did
	conn, binding, err := a.secure(c, true)
	if err != nil {
		return nil, peerIdentity{}, err
	}
	key, id, err := a.dialKey()
	if err != nil {
		return nil, peerIdentity{}, err
	}
	h := hello{key: a.pub(), id: a.nodeID, want: want}
	_, _ = rand.Read(h.nonce[:])
	copy(h.keyID[:], id)
	raw := h.marshal()
	if _, err := conn.Write(raw); err != nil {
		return nil, peerIdentity{}, fmt.Errorf("p2p: handshake: %w", err)
	}
	ans, err := readAnswer(conn)
	if err != nil {
		if peerHungUp(err) {
			err = fmt.Errorf("%w: the peer hung up without answering (a node older than handshake version %q, one that refused our key or name, or one whose handshake slots were all taken): %w", ErrUnauthenticated, handshakeVersion, err)
		}
		return nil, peerIdentity{}, fmt.Errorf("p2p: handshake: %w", err)
	}
	t := transcript(binding, raw, ans.head())
	peer := peerIdentity{ID: ans.id, Key: ed25519.PublicKey(bytes.Clone(ans.key[:]))}
	if err := checkProof("server", key, peer.Key, t, ans.mac, ans.sig); err != nil {
		return nil, peerIdentity{}, err
	}
	if want != "" && peer.ID != want {
		return nil, peerIdentity{}, fmt.Errorf("%w: %s answered where %q was expected", ErrIdentity, peer, want)
	}
	if err := a.check(peer); err != nil {
		return nil, peerIdentity{}, err
	}
	mac, sig := prove("client", key, a.priv, t)
	if _, err := conn.Write(append(mac[:], sig[:]...)); err != nil {
		return nil, peerIdentity{}, fmt.Errorf("p2p: handshake: %w", err)
	}
	ok := make([]byte, 1)
	if _, err := io.ReadFull(conn, ok); err != nil {
		return nil, peerIdentity{}, fmt.Errorf("%w: %s refused us: %w", ErrUnauthenticated, peer, err)
	}
	if ok[0] != 1 {
		return nil, peerIdentity{}, fmt.Errorf("%w: %s refused us", ErrUnauthenticated, peer)
	}
	return conn, peer, nil
}

// server authenticates an incoming connection and returns who the client
// proved to be.
func (a *auth) server(c net.Conn, deadline time.Time) (net.Conn, peerIdentity, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return nil, peerIdentity{}, err
	}
	defer func() { _ = c.SetDeadline(time.Time{}) }() // the connection fails its next IO if this did
	conn, binding, err := a.secure(c, false)
	if err != nil {
		return nil, peerIdentity{}, err
	}
	h, raw, err := readHello(conn)
	if err != nil {
		if errors.Is(err, ErrVersion) {
			_, _ = conn.Write(versionHeader()) // says which version we speak
		}
		return nil, peerIdentity{}, fmt.Errorf("p2p: handshake: %w", err)
	}
	key := a.acceptKey(h.keyID[:])
	if key == nil {
		return nil, peerIdentity{}, fmt.Errorf("%w: client uses a key we do not hold", ErrUnauthenticated)
	}
	peer := peerIdentity{ID: h.id, Key: ed25519.PublicKey(bytes.Clone(h.key[:]))}
	if h.want != "" && h.want != a.nodeID {
		// A handshake meant for another node, passed through by whoever
		// the client dialed, or an address that changed hands.
		return nil, peerIdentity{}, fmt.Errorf("%w: %s meant to reach %q", ErrIdentity, peer, h.want)
	}
	ans := answer{key: a.pub(), id: a.nodeID}
	_, _ = rand.Read(ans.nonce[:])
	head := ans.head()
	t := transcript(binding, raw, head)
	ans.mac, ans.sig = prove("server", key, a.priv, t)
	if _, err := conn.Write(append(append(head, ans.mac[:]...), ans.sig[:]...)); err != nil {
		return nil, peerIdentity{}, fmt.Errorf("p2p: handshake: %w", err)
	}
	var proof [proofSize]byte
	if _, err := io.ReadFull(conn, proof[:]); err != nil {
		return nil, peerIdentity{}, fmt.Errorf("p2p: handshake: %w", err)
	}
	var mac [macSize]byte
	var sig [ed25519.SignatureSize]byte
	copy(mac[:], proof[:])
	copy(sig[:], proof[macSize:])
	if err := checkProof("client", key, peer.Key, t, mac, sig); err != nil {
		return nil, peerIdentity{}, err
	}
	if err := a.check(peer); err != nil {
		return nil, peerIdentity{}, err
	}
	if _, err := conn.Write([]byte{1}); err != nil {
		return nil, peerIdentity{}, fmt.Errorf("p2p: handshake: %w", err)
	}
	return conn, peer, nil
}
