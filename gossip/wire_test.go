package gossip

import (
	"bytes"
	"compress/flate"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"
	"github.com/warmfleet/warmfleet/desired"
	"github.com/warmfleet/warmfleet/internal/testutil/testbolt"
	"github.com/warmfleet/warmfleet/internal/testutil/testclock"
	"github.com/warmfleet/warmfleet/spec"
)

func TestFrameRoundTripAndLimits(t *testing.T) {
	s := modelSpec("m")
	msgs := []struct {
		t msgType
		v any
	}{
		{msgSpecs, specsMsg{Records: []desired.Record{{Key: s.Key(), TS: desired.Timestamp{Wall: 1, Node: "a"}, Spec: &s}}}},
		{msgInventory, invRecord{Node: "a", Version: 1, Inv: &Inventory{DiskFreeBytes: 1}}},
		{msgWant, wantMsg{From: "a", Nodes: []string{"b"}}},
		{msgState, stateMsg{From: "a", Digest: map[string]uint64{"a": 1, strings.Repeat("n", 100): 2}}},
	}
	for _, m := range msgs {
		b, err := encodeMsg(m.t, m.v)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := decodeFrame(b, maxStreamPayload)
		if err != nil || got != m.t {
			t.Fatalf("%s: decoded type %s err %v", m.t, got, err)
		}
	}
	// A compression bomb is refused, not inflated.
	var buf bytes.Buffer
	buf.Write([]byte{wireVersion, byte(msgState), encFlate})
	w, _ := flate.NewWriter(&buf, flate.BestSpeed)
	_, _ = w.Write(bytes.Repeat([]byte(" "), maxPacketPayload+10))
	_ = w.Close()
	if _, _, err := decodeFrame(buf.Bytes(), maxPacketPayload); !errors.Is(err, errOversize) {
		t.Fatalf("bomb of %d bytes: err = %v, want oversize", buf.Len(), err)
	}
}

func TestMetaLimits(t *testing.T) {
	key := bytes.Repeat([]byte{3}, 32)
	b, err := encodeMeta(RoleNode, Meta{APIAddr: "10.0.0.1:7070", PeerAddr: "10.0.0.1:6881", Zone: "us-east-1a", Version: "v1.2.3", PeerKey: key})
	if err != nil {
		t.Fatal(err)
	}
	role, m, err := decodeMeta(b)
	if err != nil || role != RoleNode || m.Zone != "us-east-1a" || !bytes.Equal(m.PeerKey, key) {
		t.Fatalf("round trip: %v %+v %v", role, m, err)
	}
	for _, bad := range []string{`{"r":"node","k":"AAAA"}`, `{"r":"node","k":"not base64!"}`} {
		if _, _, err := decodeMeta([]byte(bad)); err == nil {
			t.Errorf("decoded %s", bad)
		}
	}
	long := strings.Repeat("x", 150)
	if _, err := encodeMeta(RoleNode, Meta{APIAddr: long, PeerAddr: long, Zone: long, Version: long}); err == nil || !strings.Contains(err.Error(), "512") {
		t.Fatalf("oversized metadata: err = %v", err)
	}
	if _, _, err := decodeMeta(make([]byte, memberlist.MetaMaxSize+1)); err == nil {
		t.Fatal("decoded oversized metadata")
	}
}

func TestKeyFile(t *testing.T) {
	dir := t.TempDir()
	k1, _ := GenerateKey()
	k2, _ := GenerateKey()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := write("ok", "# cluster key\n"+EncodeKey(k1)+"\n\n"+EncodeKey(k2)+"\n", 0o600)
	keys, err := LoadKeyFile(p)
	if err != nil || len(keys) != 2 || !bytes.Equal(keys[0], k1) || !bytes.Equal(keys[1], k2) {
		t.Fatalf("LoadKeyFile = %d keys, %v", len(keys), err)
	}
	for _, tc := range []struct{ name, content, want string }{
		{"empty", "# nothing\n", "no key"},
		{"short", EncodeKey(k1[:16]), "16 bytes"},
		{"not base64", "!!!", "base64"},
	} {
		if _, err := LoadKeyFile(write(tc.name, tc.content, 0o600)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := LoadKeyFile(write("public", EncodeKey(k1), 0o644)); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable key file: err = %v", err)
	}
	if _, err := LoadKeyFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file accepted")
	}
}

// fuzzNode is a Node that is not started: enough to run the message and
// state handlers, which is where peer bytes enter.
func fuzzNode(t testing.TB) *Node {
	n := &Node{
		cfg:     Config{NodeName: "self"},
		tun:     Tuning{}.withDefaults(),
		log:     testLogger(t),
		now:     testclock.New().Now,
		changed: make(chan struct{}, 1),
		jobs:    make(chan job, 16),
		peers:   map[string]*peer{"a": {state: MemberAlive}, "b": {state: MemberAlive}},
		wants:   map[string]wantMark{},
		recent:  map[string]recentChange{},
		keyOps:  keyOps{pending: map[string]chan keyAckMsg{"op1": make(chan keyAckMsg, 1)}},
		desired: newDesired(t, testbolt.OpenTemp(t), "self", testclock.New().Now),
	}
	n.met = newNodeMetrics(n)
	n.queue = &memberlist.TransmitLimitedQueue{NumNodes: func() int { return 3 }, RetransmitMult: 3}
	n.self = invRecord{Node: "self", Version: 1, Inv: &Inventory{}}
	return n
}

func fuzzSeeds(f *testing.F) {
	s := modelSpec("m")
	img := spec.Spec{Kind: spec.KindImage, Name: "vllm/vllm:0.6", Owner: "team/a"}
	ts := desired.Timestamp{Wall: testclock.New().Now().UnixMilli(), Node: "a"}
	for _, m := range []struct {
		t msgType
		v any
	}{
		{msgSpecs, specsMsg{Records: []desired.Record{{Key: s.Key(), TS: ts, Spec: &s}, {Key: img.Key(), TS: ts}}}},
		{msgInventory, invRecord{Node: "a", Version: 5, Inv: &Inventory{Models: map[string]ModelInventory{"m": {State: StateReady}}}}},
		{msgInventory, invRecord{Node: "b", Version: 7}},
		{msgWant, wantMsg{From: "a", Nodes: []string{"self", "b"}}},
		{msgInventories, inventoriesMsg{Records: []invRecord{{Node: "b", Version: 9, Inv: &Inventory{DiskFreeBytes: 3}}}}},
		{msgBye, byeMsg{Node: "a"}},
		{msgState, stateMsg{From: "a", Desired: true, Synced: true, Records: []desired.Record{{Key: s.Key(), TS: ts, Spec: &s}},
			Digest: map[string]uint64{"b": 12, "a": 3}, Self: &invRecord{Node: "a", Version: 3, Inv: &Inventory{}}}},
		{msgDigest, digestMsg{From: "a", Entries: map[string]uint64{"b": 40, "self": 2}}},
		{msgKeyOp, keyOpMsg{ID: "op1", From: "a", Op: KeyInstall, Key: EncodeKey(make([]byte, KeySize))}},
		{msgKeyOp, keyOpMsg{ID: "op2", From: "b", Op: KeyRemove, Fingerprint: Fingerprint(make([]byte, KeySize))}},
		{msgKeyAck, keyAckMsg{ID: "op1", Node: "a", Keys: []string{Fingerprint([]byte("k"))}}},
	} {
		b, err := encodeMsg(m.t, m.v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1, 1, 1, 0xff, 0xff})
}

// FuzzHandleMessage feeds arbitrary bytes to the NotifyMsg path.
func FuzzHandleMessage(f *testing.F) {
	fuzzSeeds(f)
	n := fuzzNode(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		n.handleMessage(b)
		for len(n.jobs) > 0 {
			<-n.jobs
		}
	})
}

// FuzzMergeState feeds arbitrary bytes to the push/pull merge path.
func FuzzMergeState(f *testing.F) {
	fuzzSeeds(f)
	n := fuzzNode(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		n.mergeState(b)
		for len(n.jobs) > 0 {
			<-n.jobs
		}
		if _, err := n.desired.Snapshot(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzDecodeMeta feeds arbitrary node metadata.
func FuzzDecodeMeta(f *testing.F) {
	b, _ := encodeMeta(RoleRouter, Meta{APIAddr: "h:1", Zone: "z"})
	f.Add(b)
	f.Add([]byte(`{"r":"node","a":1}`))
	f.Add([]byte(`{"r":"node","k":"AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		role, m, err := decodeMeta(b)
		if err != nil {
			return
		}
		again, err := encodeMeta(role, m)
		if err != nil {
			t.Fatalf("decoded metadata does not encode: %v", err)
		}
		if r2, m2, err := decodeMeta(again); err != nil || r2 != role || !reflect.DeepEqual(m2, m) {
			t.Fatalf("round trip changed %v %+v into %v %+v (%v)", role, m, r2, m2, err)
		}
	})
}

// FuzzParseKey feeds arbitrary key file lines.
func FuzzParseKey(f *testing.F) {
	k, _ := GenerateKey()
	f.Add(EncodeKey(k))
	f.Add("====")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err == nil && len(k) != KeySize {
			t.Fatalf("ParseKey(%q) gave %d bytes", s, len(k))
		}
	})
}

// FuzzDecodeDigestAndKeyMessages feeds arbitrary payloads to the decoders
// of digests and keyring messages: whatever they accept must satisfy the
// rules the handlers rely on.
func FuzzDecodeDigestAndKeyMessages(f *testing.F) {
	f.Add([]byte(`{"f":"a","d":{"b":1}}`))
	f.Add([]byte(`{"id":"x","f":"a","op":"use","fp":"sha256:0011223344556677"}`))
	f.Add([]byte(`{"id":"x","n":"a","k":["sha256:0011223344556677"],"e":"boom"}`))
	f.Add([]byte(`{"id":"x","f":"a","op":"install","k":"AAAA"}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		if d, err := decodeDigest(p); err == nil {
			if desired.ValidateNodeName(d.From) != nil || len(d.Entries) == 0 || len(d.Entries) > maxDigestEntries {
				t.Fatalf("accepted bad digest %+v", d)
			}
			for n, v := range d.Entries {
				if desired.ValidateNodeName(n) != nil || v == 0 {
					t.Fatalf("accepted bad digest entry %q=%d", n, v)
				}
			}
		}
		if m, err := decodeKeyOp(p); err == nil {
			switch m.Op {
			case KeyInstall:
				if k, err := ParseKey(m.Key); err != nil || len(k) != KeySize {
					t.Fatalf("accepted install of a bad key: %v", err)
				}
			case KeyUse, KeyRemove:
				if !ValidFingerprint(m.Fingerprint) {
					t.Fatalf("accepted bad fingerprint %q", m.Fingerprint)
				}
			case KeyList:
			default:
				t.Fatalf("accepted op %q", m.Op)
			}
		}
		if a, err := decodeKeyAck(p); err == nil {
			for _, fp := range a.Keys {
				if !ValidFingerprint(fp) {
					t.Fatalf("accepted bad fingerprint %q in an ack", fp)
				}
			}
		}
	})
}

// TestKeyFilePrivate: a key file is private when only its owner, or also
// the process's own non-root group (a Kubernetes fsGroup), can read it.
func TestKeyFilePrivate(t *testing.T) {
	for _, tc := range []struct {
		perm             os.FileMode
		fileGID, procGID int
		want             bool
	}{
		{0o600, 0, 0, true},
		{0o400, 0, 0, true},
		{0o440, 65532, 65532, true}, // kubelet's Secret with fsGroup 65532, runAsGroup 65532
		{0o640, 1000, 1000, true},
		{0o440, 0, 0, false}, // root's group is shared by too much
		{0o440, 65532, 1000, false},
		{0o440, -1, 1000, false}, // group unknown
		{0o460, 65532, 65532, false},
		{0o444, 65532, 65532, false},
		{0o604, 0, 0, false},
		{0o610, 0, 0, false},
	} {
		if got := keyFilePrivate(tc.perm, tc.fileGID, tc.procGID); got != tc.want {
			t.Errorf("keyFilePrivate(%v, gid %d, process gid %d) = %v, want %v", tc.perm, tc.fileGID, tc.procGID, got, tc.want)
		}
	}
}
