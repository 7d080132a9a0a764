package gossip

import (
	"encoding/json"
	"testing"
)

// TestInventoryJSONCarriesTransferCounters: the S3 and peer byte counters
// survive the trip through the wire encoding (the decoder lists its fields
// itself, so a field it forgets is silently zero on every other node).
func TestInventoryJSONCarriesTransferCounters(t *testing.T) {
	in := Inventory{Models: map[string]ModelInventory{"m": {State: StateReady, BytesDone: 5, BytesTotal: 5}},
		DiskFreeBytes: 7, DiskTotalBytes: 9, S3Bytes: 1 << 40, PeerBytesIn: 12345, PeerBytesOut: 678}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Inventory
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.S3Bytes != in.S3Bytes || out.PeerBytesIn != in.PeerBytesIn || out.PeerBytesOut != in.PeerBytesOut ||
		out.DiskFreeBytes != in.DiskFreeBytes || out.Models["m"] != in.Models["m"] {
		t.Fatalf("decoded %+v from %s; want %+v", out, b, in)
	}
	more := out
	more.S3Bytes, more.PeerBytesOut = more.S3Bytes+1, more.PeerBytesOut+1
	if !progressOnly(in, more) {
		t.Fatal("a change in transfer counters alone should wait for the progress flush")
	}
}
