package p2p

import (
	"bytes"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkAcceptKey is an acceptor finding the key a dialer names, with two
// keys installed (a rotation) and the dialer on the second.
func BenchmarkAcceptKey(b *testing.B) {
	second := bytes.Repeat([]byte{9}, ClusterKeySize)
	a, err := newAuth("n", func() [][]byte { return [][]byte{testKey, second} }, false)
	if err != nil {
		b.Fatal(err)
	}
	id := keyID(macKey(second))
	b.ReportAllocs()
	for b.Loop() {
		if a.acceptKey(id) == nil {
			b.Fatal("key not found")
		}
	}
}

// An acceptor derives each installed key's HMAC key once, not once per
// connection, and follows a rotation: a key installed later is accepted, a
// removed one refused, and nothing is derived again until the keys change.
func TestAcceptKeyDerivesOncePerInstalledKey(t *testing.T) {
	k1, k2, k3 := testKey, bytes.Repeat([]byte{9}, ClusterKeySize), bytes.Repeat([]byte{5}, ClusterKeySize)
	var mu sync.Mutex
	installed := [][]byte{k1, k2}
	a, err := newAuth("n", func() [][]byte {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(installed)
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	var derivations atomic.Int64
	a.derived.derive = func(k []byte) []byte { derivations.Add(1); return macKey(k) }
	id := func(k []byte) []byte { return keyID(macKey(k)) }
	accepts := func(k []byte) bool { return bytes.Equal(a.acceptKey(id(k)), macKey(k)) }

	for range 10 {
		if !accepts(k1) || !accepts(k2) || accepts(k3) {
			t.Fatal("with k1 and k2 installed: want k1 and k2 accepted, k3 refused")
		}
	}
	if mk, kid, err := a.dialKey(); err != nil || !bytes.Equal(mk, macKey(k1)) || !bytes.Equal(kid, id(k1)) {
		t.Fatalf("dial key: %v", err)
	}
	if n := derivations.Load(); n != 2 {
		t.Fatalf("%d derivations for 21 handshakes with 2 keys installed, want 2", n)
	}

	mu.Lock()
	installed = [][]byte{k3, k2} // k3 installed first, k1 removed
	mu.Unlock()
	for range 10 {
		if accepts(k1) || !accepts(k2) || !accepts(k3) {
			t.Fatal("after the rotation: want k1 refused, k2 and k3 accepted")
		}
	}
	if mk, _, err := a.dialKey(); err != nil || !bytes.Equal(mk, macKey(k3)) {
		t.Fatalf("dial key after the rotation: %v", err)
	}
	if n := derivations.Load(); n != 4 {
		t.Fatalf("%d derivations in all, want 4 (2 keys, then 2 after the rotation)", n)
	}

	mu.Lock()
	installed[0] = bytes.Repeat([]byte{6}, ClusterKeySize) // the first key replaced
	mu.Unlock()
	if accepts(k3) || !accepts(installed[0]) {
		t.Fatal("the first key replaced: want the old one refused, the new one accepted")
	}
}
