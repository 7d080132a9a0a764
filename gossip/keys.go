package gossip

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/warmfleet/warmfleet/desired"
)

// Fleet-wide keyring operations, like serf's keyring queries: the node asked
// sends the operation to every live member over memberlist's reliable
// channel, which is encrypted and authenticated with the cluster key, so
// only a holder of a current key can issue one or read one; each member
// applies it to its own keyring and answers. Only installing sends key
// bytes; use and remove name the key by fingerprint.

// KeyOp is a keyring operation.
type KeyOp string

// Keyring operations.
const (
	KeyList    KeyOp = "list"
	KeyInstall KeyOp = "install"
	KeyUse     KeyOp = "use"
	KeyRemove  KeyOp = "remove"
)

// ParseKeyOp checks an operation name.
func ParseKeyOp(s string) (KeyOp, error) {
	switch op := KeyOp(s); op {
	case KeyList, KeyInstall, KeyUse, KeyRemove:
		return op, nil
	}
	return "", fmt.Errorf("keyring operation %q: want list, install, use or remove", s)
}

// KeyResult is one member's answer to a keyring operation.
type KeyResult struct {
	Node string
	// Err is empty when the member applied the operation.
	Err string
	// Keys are the fingerprints of the member's keys after the operation,
	// the one in use first.
	Keys []string
}

// ErrPrimaryKey refuses to remove a key that a member encrypts with.
var ErrPrimaryKey = errors.New("key is in use (primary)")

// ErrUnknownKey is a fingerprint that names no installed key.
var ErrUnknownKey = errors.New("no installed key has this fingerprint")

// Fingerprint names a key without revealing it: "sha256:" and the first 8
// bytes of its SHA-256, in hex.
func Fingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// ValidFingerprint reports whether s has the form Fingerprint returns.
func ValidFingerprint(s string) bool {
	h, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(h) != 16 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// KeyFingerprints returns this node's key fingerprints, the one in use first.
func (n *Node) KeyFingerprints() []string {
	keys := n.Keys()
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = Fingerprint(k)
	}
	return out
}

// keyOpMsg asks a member to change its keyring.
type keyOpMsg struct {
	ID   string `json:"id"`
	From string `json:"f"`
	Op   KeyOp  `json:"op"`
	// Key is the base64 key to install; Fingerprint names the key to use or
	// remove.
	Key         string `json:"k,omitempty"`
	Fingerprint string `json:"fp,omitempty"`
}

type keyAckMsg struct {
	ID   string   `json:"id"`
	Node string   `json:"n"`
	Err  string   `json:"e,omitempty"`
	Keys []string `json:"k,omitempty"`
}

const maxKeyOpID = 64

func decodeKeyOp(p []byte) (keyOpMsg, error) {
	var m keyOpMsg
	if err := json.Unmarshal(p, &m); err != nil {
		return m, fmt.Errorf("keyop: %w", err)
	}
	if m.ID == "" || len(m.ID) > maxKeyOpID {
		return m, fmt.Errorf("%w: keyop: id length %d", errInvalid, len(m.ID))
	}
	if err := desired.ValidateNodeName(m.From); err != nil {
		return m, fmt.Errorf("%w: keyop: from: %w", errInvalid, err)
	}
	if _, err := ParseKeyOp(string(m.Op)); err != nil {
		return m, fmt.Errorf("%w: keyop: %w", errInvalid, err)
	}
	switch m.Op {
	case KeyInstall:
		if _, err := ParseKey(m.Key); err != nil {
			return m, fmt.Errorf("%w: keyop: %w", errInvalid, err)
		}
	case KeyUse, KeyRemove:
		if !ValidFingerprint(m.Fingerprint) {
			return m, fmt.Errorf("%w: keyop: bad fingerprint", errInvalid)
		}
	}
	return m, nil
}

func decodeKeyAck(p []byte) (keyAckMsg, error) {
	var m keyAckMsg
	if err := json.Unmarshal(p, &m); err != nil {
		return m, fmt.Errorf("keyack: %w", err)
	}
	if m.ID == "" || len(m.ID) > maxKeyOpID {
		return m, fmt.Errorf("%w: keyack: id length %d", errInvalid, len(m.ID))
	}
	if err := desired.ValidateNodeName(m.Node); err != nil {
		return m, fmt.Errorf("%w: keyack: %w", errInvalid, err)
	}
	if len(m.Keys) > 64 || len(m.Err) > 1024 {
		return m, fmt.Errorf("%w: keyack: %d keys, error of %d bytes", errOversize, len(m.Keys), len(m.Err))
	}
	for _, fp := range m.Keys {
		if !ValidFingerprint(fp) {
			return m, fmt.Errorf("%w: keyack: bad fingerprint", errInvalid)
		}
	}
	return m, nil
}

// keyOps tracks this node's fleet-wide operations awaiting answers.
type keyOps struct {
	mu      sync.Mutex
	pending map[string]chan keyAckMsg
}

// applyKeyOpLocal runs an operation on this node's keyring and persists the
// result (Config.KeyFile).
func (n *Node) applyKeyOpLocal(op KeyOp, key []byte, fp string) error {
	if n.keyring == nil {
		return ErrInsecure
	}
	n.keyMu.Lock()
	defer n.keyMu.Unlock()
	if op != KeyInstall && op != KeyList {
		k, ok := n.keyByFingerprint(fp)
		if !ok {
			return fmt.Errorf("%s: %w", fp, ErrUnknownKey)
		}
		key = k
	}
	var err error
	switch op {
	case KeyList:
		return nil
	case KeyInstall:
		err = n.InstallKey(key)
	case KeyUse:
		err = n.UseKey(key)
	case KeyRemove:
		if bytes.Equal(key, n.keyring.GetPrimaryKey()) {
			return fmt.Errorf("%s: %w", fp, ErrPrimaryKey)
		}
		err = n.RemoveKey(key)
	}
	if err != nil {
		return err
	}
	return n.saveKeyFile()
}

func (n *Node) keyByFingerprint(fp string) ([]byte, bool) {
	for _, k := range n.keyring.GetKeys() {
		if Fingerprint(k) == fp {
			return k, true
		}
	}
	return nil, false
}

// saveKeyFile rewrites Config.KeyFile with the keyring, the key in use
// first, so a restarted node rejoins with the keys the fleet uses now.
func (n *Node) saveKeyFile() error {
	if n.cfg.KeyFile == "" {
		return nil
	}
	if err := WriteKeyFile(n.cfg.KeyFile, n.Keys()); err != nil {
		return fmt.Errorf("gossip: save keyring: %w", err)
	}
	return nil
}

// KeyRequest is a fleet-wide keyring operation.
type KeyRequest struct {
	Op KeyOp
	// Key is the key to install (and may name the key to use or remove).
	Key []byte
	// Fingerprint names the key to use or remove, so that the key itself
	// need not travel; taken from Key when empty.
	Fingerprint string
}

// FleetKeys applies a keyring operation on this node and then on every live
// member, and returns each member's answer sorted by name. This node goes
// first: an operation it refuses (unknown key, bad request) changes nothing
// anywhere. Removing a key that any member still encrypts with is refused
// before anything changes (ErrPrimaryKey). A member that does not answer
// before ctx ends (10s without a deadline) is reported with an error.
//
// Rotation without downtime: install the new key, then use it, then remove
// the old one; each step should succeed on every member before the next.
func (n *Node) FleetKeys(ctx context.Context, req KeyRequest) ([]KeyResult, error) {
	if n.keyring == nil {
		return nil, ErrInsecure
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, keyOpTimeout)
		defer cancel()
	}
	if _, err := ParseKeyOp(string(req.Op)); err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	if req.Key != nil && len(req.Key) != KeySize {
		return nil, fmt.Errorf("gossip: key is %d bytes, want %d", len(req.Key), KeySize)
	}
	msg := keyOpMsg{From: n.cfg.NodeName, Op: req.Op}
	switch req.Op {
	case KeyInstall:
		if req.Key == nil {
			return nil, errors.New("gossip: install needs the key")
		}
		msg.Key = EncodeKey(req.Key)
	case KeyUse, KeyRemove:
		msg.Fingerprint = req.Fingerprint
		if msg.Fingerprint == "" && req.Key != nil {
			msg.Fingerprint = Fingerprint(req.Key)
		}
		if !ValidFingerprint(msg.Fingerprint) {
			return nil, fmt.Errorf("gossip: %s needs a key or its fingerprint (sha256:<16 hex digits>)", req.Op)
		}
	}
	if req.Op == KeyRemove {
		list, err := n.FleetKeys(ctx, KeyRequest{Op: KeyList})
		if err != nil {
			return nil, err
		}
		var users []string
		for _, r := range list {
			if len(r.Keys) > 0 && r.Keys[0] == msg.Fingerprint {
				users = append(users, r.Node)
			}
		}
		if len(users) > 0 {
			return nil, fmt.Errorf("gossip: %s on %s: %w; use another key fleet-wide first", msg.Fingerprint, strings.Join(users, ", "), ErrPrimaryKey)
		}
	}
	return n.fanOutKeyOp(ctx, msg, req.Key)
}

func (n *Node) fanOutKeyOp(ctx context.Context, msg keyOpMsg, key []byte) ([]KeyResult, error) {
	var id [12]byte
	_, _ = rand.Read(id[:])
	msg.ID = base64.RawURLEncoding.EncodeToString(id[:])
	wire, err := encodeMsg(msgKeyOp, msg)
	if err != nil {
		return nil, err
	}

	n.mu.Lock()
	var targets []*memberlist.Node
	for name, p := range n.peers {
		if name != n.cfg.NodeName && p.state.member() && p.ip != nil {
			targets = append(targets, &memberlist.Node{Name: name, Addr: p.ip, Port: p.port})
		}
	}
	n.mu.Unlock()
	// Room for one answer and one send failure per member: nobody blocks.
	acks := make(chan keyAckMsg, 2*len(targets))
	n.keyOps.mu.Lock()
	n.keyOps.pending[msg.ID] = acks
	n.keyOps.mu.Unlock()
	defer func() {
		n.keyOps.mu.Lock()
		delete(n.keyOps.pending, msg.ID)
		n.keyOps.mu.Unlock()
	}()

	results := map[string]KeyResult{}
	// This node first: if it cannot apply the operation, nobody should.
	if err := n.applyKeyOpLocal(msg.Op, key, msg.Fingerprint); err != nil {
		return nil, fmt.Errorf("gossip: %s on this node: %w", msg.Op, err)
	}
	results[n.cfg.NodeName] = KeyResult{Node: n.cfg.NodeName, Keys: n.KeyFingerprints()}

	waiting := map[string]bool{}
	for _, t := range targets {
		waiting[t.Name] = true
		results[t.Name] = KeyResult{Node: t.Name, Err: "no answer"}
	}
	// Sends block on slow members; a few at a time bounds the goroutines. A
	// failed send answers for its member.
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, to := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			if err := n.ml.SendReliable(to, wire); err != nil {
				acks <- keyAckMsg{ID: msg.ID, Node: to.Name, Err: "send: " + err.Error()}
			}
		}()
	}
	for len(waiting) > 0 {
		select {
		case a := <-acks:
			if !waiting[a.Node] {
				continue
			}
			delete(waiting, a.Node)
			results[a.Node] = KeyResult{Node: a.Node, Err: a.Err, Keys: a.Keys}
		case <-ctx.Done():
			waiting = nil
		case <-n.stop:
			waiting = nil
		}
	}
	wg.Wait()
	out := make([]KeyResult, 0, len(results))
	for _, r := range results {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b KeyResult) int { return cmp.Compare(a.Node, b.Node) })
	return out, nil
}

// handleKeyOp applies a member's request and answers it.
func (n *Node) handleKeyOp(m keyOpMsg) {
	n.mu.Lock()
	p := n.peers[m.From]
	known := p != nil && p.state.member() && m.From != n.cfg.NodeName
	n.mu.Unlock()
	if !known {
		n.met.drop(dropUnexpected)
		return
	}
	var key []byte
	if m.Op == KeyInstall {
		key, _ = ParseKey(m.Key) // validated by decodeKeyOp
	}
	ack := keyAckMsg{ID: m.ID, Node: n.cfg.NodeName}
	if err := n.applyKeyOpLocal(m.Op, key, m.Fingerprint); err != nil {
		ack.Err = err.Error()
		n.log.Warn("gossip: keyring operation failed", "op", m.Op, "from", m.From, "err", err)
	} else if m.Op != KeyList {
		n.log.Info("gossip: keyring changed", "op", m.Op, "from", m.From, "key", cmp.Or(m.Fingerprint, Fingerprint(key)))
	}
	ack.Keys = n.KeyFingerprints()
	msg, err := encodeMsg(msgKeyAck, ack)
	if err != nil {
		n.log.Error("gossip: encode key ack", "err", err)
		return
	}
	n.enqueue(job{to: m.From, send: msg})
}

func (n *Node) handleKeyAck(a keyAckMsg) {
	n.keyOps.mu.Lock()
	ch := n.keyOps.pending[a.ID]
	n.keyOps.mu.Unlock()
	if ch == nil {
		n.met.drop(dropUnexpected)
		return
	}
	select {
	case ch <- a:
	default: // more answers than members asked: ignore the extra
	}
}

// keyOpTimeout is how long FleetKeys waits for answers when ctx has no
// deadline.
const keyOpTimeout = 10 * time.Second
