package gossip

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/warmfleet/warmfleet/spec"
)

// State is the progress of one cached item on one node.
type State string

// Cache item states.
const (
	StatePending     State = "pending"
	StateDownloading State = "downloading"
	StateReady       State = "ready"
	StateFailed      State = "failed"
)

func (s State) valid() bool {
	switch s {
	case StatePending, StateDownloading, StateReady, StateFailed:
		return true
	}
	return false
}

// ModelInventory is one model cache on a node. JSON names are short because
// every node carries every other node's inventory.
type ModelInventory struct {
	Revision   string `json:"r,omitempty"`
	State      State  `json:"s"`
	BytesDone  int64  `json:"d,omitempty"`
	BytesTotal int64  `json:"t,omitempty"`
	Path       string `json:"p,omitempty"`
}

// ImageInventory is one container image on a node.
type ImageInventory struct {
	Digest     string `json:"g,omitempty"`
	State      State  `json:"s"`
	BytesDone  int64  `json:"d,omitempty"`
	BytesTotal int64  `json:"t,omitempty"`
}

// Endpoint is an inference endpoint running on a node.
type Endpoint struct {
	Model string `json:"m"`
	URL   string `json:"u"`
	// Speed is the endpoint's engine speed relative to the fleet's usual
	// backend (0: not given, 1). Older members leave it out and ignore it.
	Speed float64 `json:"s,omitempty"`
}

// Inventory is what one node holds and serves.
type Inventory struct {
	// Models by model name.
	Models map[string]ModelInventory `json:"m,omitempty"`
	// Images by image reference.
	Images         map[string]ImageInventory `json:"i,omitempty"`
	Endpoints      []Endpoint                `json:"e,omitempty"`
	DiskFreeBytes  int64                     `json:"f,omitempty"`
	DiskTotalBytes int64                     `json:"c,omitempty"`
	// Labels are the node's labels, matched by spec target selectors.
	Labels map[string]string `json:"l,omitempty"`
	// S3Bytes, PeerBytesIn and PeerBytesOut count the bytes this process
	// read from S3 and received from and sent to peers since it started,
	// so the fleet can see how much the swarm spared the origin.
	S3Bytes      int64 `json:"s3,omitempty"`
	PeerBytesIn  int64 `json:"pi,omitempty"`
	PeerBytesOut int64 `json:"po,omitempty"`
}

// UnmarshalJSON decodes an inventory, refusing a map or list with more
// entries than an inventory may hold before decoding the rest of it: a
// stream message inflates to 16 MiB, which as one inventory's maps would
// cost some 200 MB before Validate could refuse them.
func (inv *Inventory) UnmarshalJSON(b []byte) error {
	var w struct {
		Models         inventoryMap[ModelInventory] `json:"m"`
		Images         inventoryMap[ImageInventory] `json:"i"`
		Endpoints      inventoryList[Endpoint]      `json:"e"`
		DiskFreeBytes  int64                        `json:"f"`
		DiskTotalBytes int64                        `json:"c"`
		Labels         inventoryMap[string]         `json:"l"`
		S3Bytes        int64                        `json:"s3"`
		PeerBytesIn    int64                        `json:"pi"`
		PeerBytesOut   int64                        `json:"po"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*inv = Inventory{Models: w.Models, Images: w.Images, Endpoints: w.Endpoints, DiskFreeBytes: w.DiskFreeBytes,
		DiskTotalBytes: w.DiskTotalBytes, Labels: w.Labels, S3Bytes: w.S3Bytes, PeerBytesIn: w.PeerBytesIn, PeerBytesOut: w.PeerBytesOut}
	return nil
}

// inventoryMap and inventoryList decode at most maxInventoryItems entries.
type (
	inventoryMap[V any]  map[string]V
	inventoryList[T any] []T
)

func (m *inventoryMap[V]) UnmarshalJSON(b []byte) error {
	out, err := decodeObject[V](b, maxInventoryItems)
	*m = out
	return err
}

func (l *inventoryList[T]) UnmarshalJSON(b []byte) error {
	out, err := decodeArray[T](b, maxInventoryItems)
	*l = out
	return err
}

// Bounds on one inventory. They keep a record well under memberlist's
// stream limits and a hostile peer from making us hold huge maps.
const (
	maxInventoryItems = 4096
	maxInventoryStr   = 1024
	maxInventoryBytes = 1 << 20
	// maxEndpointSpeed bounds an endpoint's speed, as the daemon's API does.
	maxEndpointSpeed = 64
)

// Validate checks an inventory from this node or a peer.
func (inv Inventory) Validate() error {
	var errs []error
	if n := len(inv.Models) + len(inv.Images) + len(inv.Endpoints) + len(inv.Labels); n > maxInventoryItems {
		errs = append(errs, fmt.Errorf("inventory has %d entries, at most %d", n, maxInventoryItems))
	}
	checkBytes := func(what string, done, total int64) {
		if done < 0 || total < 0 {
			errs = append(errs, fmt.Errorf("%s: negative byte count", what))
		}
	}
	checkStr := func(what, s string) {
		if len(s) > maxInventoryStr {
			errs = append(errs, fmt.Errorf("%s: %d bytes, at most %d", what, len(s), maxInventoryStr))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(inv.Models)) {
		m := inv.Models[name]
		what := "model " + truncate(name)
		if name == "" {
			errs = append(errs, errors.New("model with an empty name"))
		}
		checkStr(what, name)
		checkStr(what+" revision", m.Revision)
		checkStr(what+" path", m.Path)
		if !m.State.valid() {
			errs = append(errs, fmt.Errorf("%s: state %q: want pending, downloading, ready or failed", what, truncate(string(m.State))))
		}
		checkBytes(what, m.BytesDone, m.BytesTotal)
	}
	for _, ref := range slices.Sorted(maps.Keys(inv.Images)) {
		im := inv.Images[ref]
		what := "image " + truncate(ref)
		if ref == "" {
			errs = append(errs, errors.New("image with an empty reference"))
		}
		checkStr(what, ref)
		checkStr(what+" digest", im.Digest)
		if !im.State.valid() {
			errs = append(errs, fmt.Errorf("%s: state %q: want pending, downloading, ready or failed", what, truncate(string(im.State))))
		}
		checkBytes(what, im.BytesDone, im.BytesTotal)
	}
	for _, e := range inv.Endpoints {
		checkStr("endpoint model", e.Model)
		checkStr("endpoint url", e.URL)
		if e.Model == "" || e.URL == "" {
			errs = append(errs, errors.New("endpoint needs a model and a URL"))
		}
		if e.Speed < 0 || e.Speed > maxEndpointSpeed {
			errs = append(errs, fmt.Errorf("endpoint %s: speed %v: want 0..%d", truncate(e.URL), e.Speed, maxEndpointSpeed))
		}
	}
	checkBytes("disk", inv.DiskFreeBytes, inv.DiskTotalBytes)
	checkBytes("S3 bytes", inv.S3Bytes, 0)
	checkBytes("peer bytes", inv.PeerBytesIn, inv.PeerBytesOut)
	for _, k := range slices.Sorted(maps.Keys(inv.Labels)) {
		if err := spec.ValidateLabel(k, inv.Labels[k]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func truncate(s string) string {
	if len(s) > 64 {
		return fmt.Sprintf("%q...", s[:64])
	}
	return fmt.Sprintf("%q", s)
}

// Clone returns a deep copy.
func (inv Inventory) Clone() Inventory {
	inv.Models = maps.Clone(inv.Models)
	inv.Images = maps.Clone(inv.Images)
	inv.Endpoints = slices.Clone(inv.Endpoints)
	inv.Labels = maps.Clone(inv.Labels)
	return inv
}

// progressOnly reports whether b differs from a only in byte counters and
// free disk space: such updates are frequent while downloading and can wait
// for the next progress flush instead of a broadcast each.
func progressOnly(a, b Inventory) bool {
	if len(a.Models) != len(b.Models) || len(a.Images) != len(b.Images) ||
		a.DiskTotalBytes != b.DiskTotalBytes || !slices.Equal(a.Endpoints, b.Endpoints) ||
		!maps.Equal(a.Labels, b.Labels) {
		return false
	}
	for k, am := range a.Models {
		bm, ok := b.Models[k]
		if !ok || am.State != bm.State || am.Revision != bm.Revision || am.Path != bm.Path || am.BytesTotal != bm.BytesTotal {
			return false
		}
	}
	for k, ai := range a.Images {
		bi, ok := b.Images[k]
		if !ok || ai.State != bi.State || ai.Digest != bi.Digest || ai.BytesTotal != bi.BytesTotal {
			return false
		}
	}
	return true
}
