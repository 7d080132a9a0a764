package gossip

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/warmfleet/warmfleet/desired"
)

// Wire format of every message this package sends through memberlist:
//
//	byte 0: format version (1)
//	byte 1: message type
//	byte 2: encoding: 0 JSON, 1 raw DEFLATE of JSON
//	rest:   payload
//
// JSON keeps the decoder simple and safe; DEFLATE makes the repeated field
// names and node names nearly free. A message is compressed only when that
// makes it smaller.
const (
	wireVersion byte = 1
	encJSON     byte = 0
	encFlate    byte = 1
	headerLen        = 3
)

type msgType byte

const (
	msgSpecs       msgType = 1 // broadcast: desired-state records
	msgInventory   msgType = 2 // broadcast: one node's inventory, or only its new version
	msgWant        msgType = 3 // reliable: ask a peer for inventory records
	msgInventories msgType = 4 // reliable: inventory records answering a want
	msgState       msgType = 5 // push/pull: full desired state + inventory digest
	msgBye         msgType = 6 // broadcast: a member is leaving on purpose
	msgDigest      msgType = 7 // packet: recently changed inventory versions
	msgKeyOp       msgType = 8 // reliable: a fleet-wide keyring operation
	msgKeyAck      msgType = 9 // reliable: a member's answer to a keyring operation
	msgLast                = msgKeyAck
)

func (t msgType) String() string {
	switch t {
	case msgSpecs:
		return "specs"
	case msgInventory:
		return "inventory"
	case msgWant:
		return "want"
	case msgInventories:
		return "inventories"
	case msgState:
		return "state"
	case msgBye:
		return "bye"
	case msgDigest:
		return "digest"
	case msgKeyOp:
		return "keyop"
	case msgKeyAck:
		return "keyack"
	}
	return fmt.Sprintf("type-%d", byte(t))
}

// Size limits on decoded payloads. Packets never carry more than a UDP
// datagram; streams carry whole states, bounded so a peer cannot make us
// allocate without end (memberlist's own cap is 20 MiB).
const (
	maxPacketPayload = 64 << 10
	maxStreamPayload = 16 << 20
	maxRecords       = 1 << 16
	maxDigest        = 1 << 16
)

var (
	errOversize = errors.New("message too large")
	// errInvalid marks a message that decoded but breaks the rules.
	errInvalid = errors.New("invalid message")
)

// invRecord is one node's inventory at one version. Inv is nil in a version
// bump: the record was too big to broadcast and must be fetched.
type invRecord struct {
	Node    string     `json:"n"`
	Version uint64     `json:"v"`
	Updated int64      `json:"u,omitempty"` // unix ms on the owner's clock
	Inv     *Inventory `json:"i,omitempty"`
}

func (r invRecord) validate() error {
	if err := desired.ValidateNodeName(r.Node); err != nil {
		return err
	}
	if r.Version == 0 {
		return fmt.Errorf("inventory of %q: version 0", r.Node)
	}
	if r.Inv != nil {
		if err := r.Inv.Validate(); err != nil {
			return fmt.Errorf("inventory of %q: %w", r.Node, err)
		}
	}
	return nil
}

type specsMsg struct {
	Records list[desired.Record] `json:"r"`
}

type byeMsg struct {
	Node string `json:"n"`
}

type wantMsg struct {
	From  string       `json:"f"`
	Nodes list[string] `json:"n"`
	// Packet asks for the answer in a packet when it fits one.
	Packet bool `json:"p,omitempty"`
}

type inventoriesMsg struct {
	Records list[invRecord] `json:"r"`
}

type stateMsg struct {
	From string `json:"f"`
	// Desired is false when the sender keeps no desired state (a router).
	Desired bool                 `json:"ds,omitempty"`
	Records list[desired.Record] `json:"r,omitempty"`
	Stale   bool                 `json:"st,omitempty"`
	Synced  bool                 `json:"sy,omitempty"`
	// Digest maps every live node whose inventory the sender holds to its
	// version.
	Digest dict[uint64] `json:"d,omitempty"`
	// Self is the sender's own inventory, always in full.
	Self *invRecord `json:"i,omitempty"`
}

// maxListLen bounds every list and map of a message (maxRecords,
// maxDigest); the decoders then check the tighter limits.
const maxListLen = max(maxRecords, maxDigest)

// list is a JSON array that refuses its element maxListLen+1 before
// decoding it. Counting after json.Unmarshal is too late: a stream payload
// of "{}," repeated decodes into millions of records, over a gigabyte of
// allocations from one message that compresses to a few KiB on the wire.
type list[T any] []T

func (l *list[T]) UnmarshalJSON(b []byte) error {
	out, err := decodeArray[T](b, maxListLen)
	*l = out
	return err
}

// dict is a JSON object bounded like list.
type dict[V any] map[string]V

func (d *dict[V]) UnmarshalJSON(b []byte) error {
	out, err := decodeObject[V](b, maxListLen)
	*d = out
	return err
}

// openJSON returns a decoder past the opening delim of the value in b, or
// nil: with an error if the value is something else, without one if it is
// null.
func openJSON(b []byte, delim json.Delim, want string) (*json.Decoder, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	switch {
	case err != nil:
		return nil, err
	case tok == nil:
		return nil, nil
	case tok != delim:
		return nil, fmt.Errorf("want %s, got %v", want, tok)
	}
	return dec, nil
}

// decodeArray decodes a JSON array (or null: nil) one element at a time,
// refusing element limit+1 before decoding it.
func decodeArray[T any](b []byte, limit int) ([]T, error) {
	dec, err := openJSON(b, '[', "an array")
	if dec == nil {
		return nil, err
	}
	var out []T
	for dec.More() {
		if len(out) == limit {
			return nil, fmt.Errorf("%w: more than %d elements", errOversize, limit)
		}
		var v T
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// decodeObject decodes a JSON object (or null: nil) one member at a time,
// refusing a new key past limit before decoding its value.
func decodeObject[V any](b []byte, limit int) (map[string]V, error) {
	dec, err := openJSON(b, '{', "an object")
	if dec == nil {
		return nil, err
	}
	out := map[string]V{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := tok.(string) // object keys are strings
		if _, dup := out[k]; !dup && len(out) == limit {
			return nil, fmt.Errorf("%w: more than %d entries", errOversize, limit)
		}
		var v V
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// encodeMsg frames v as a message of type t.
func encodeMsg(t msgType, v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", t, err)
	}
	return frameMsg(t, body), nil
}

// frameMsg frames the JSON body of a message of type t, DEFLATE-compressed
// when that makes it smaller: the result is never longer than
// headerLen+len(body).
func frameMsg(t msgType, body []byte) []byte {
	if len(body) >= 128 {
		level := flate.DefaultCompression
		if len(body) > 16<<10 {
			level = flate.BestSpeed
		}
		var buf bytes.Buffer
		buf.Write([]byte{wireVersion, byte(t), encFlate})
		w, _ := flate.NewWriter(&buf, level)
		if _, err := w.Write(body); err == nil && w.Close() == nil && buf.Len() < len(body)+headerLen {
			return buf.Bytes()
		}
	}
	return append([]byte{wireVersion, byte(t), encJSON}, body...)
}

// encodeMsgPlain frames v uncompressed: for small messages sent many times
// a second, where a DEFLATE writer per message (hundreds of KB of state)
// would cost more CPU than the bytes it saves.
func encodeMsgPlain(t msgType, v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", t, err)
	}
	return append([]byte{wireVersion, byte(t), encJSON}, body...), nil
}

// decodeFrame checks the header and returns the type and JSON payload,
// inflated if needed, refusing payloads over max.
func decodeFrame(b []byte, max int) (msgType, []byte, error) {
	if len(b) < headerLen {
		return 0, nil, fmt.Errorf("message of %d bytes is shorter than its header", len(b))
	}
	if b[0] != wireVersion {
		return 0, nil, fmt.Errorf("message format version %d: want %d", b[0], wireVersion)
	}
	t := msgType(b[1])
	if t < msgSpecs || t > msgLast {
		return 0, nil, fmt.Errorf("unknown message type %d", b[1])
	}
	body := b[headerLen:]
	switch b[2] {
	case encJSON:
		if len(body) > max {
			return 0, nil, fmt.Errorf("%s: %w (%d bytes, limit %d)", t, errOversize, len(body), max)
		}
		return t, body, nil
	case encFlate:
		r := flate.NewReader(bytes.NewReader(body))
		out, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
		if err != nil {
			return 0, nil, fmt.Errorf("%s: inflate: %w", t, err)
		}
		if len(out) > max {
			return 0, nil, fmt.Errorf("%s: %w (inflates past %d bytes)", t, errOversize, max)
		}
		return t, out, nil
	}
	return 0, nil, fmt.Errorf("%s: unknown encoding %d", t, b[2])
}

func decodeSpecs(p []byte) (specsMsg, error) {
	var m specsMsg
	if err := json.Unmarshal(p, &m); err != nil {
		return m, fmt.Errorf("specs: %w", err)
	}
	if len(m.Records) > maxRecords {
		return m, fmt.Errorf("%w: specs: %d records, at most %d", errOversize, len(m.Records), maxRecords)
	}
	// Records are validated one by one on merge so one bad record does not
	// hide the good ones.
	return m, nil
}

func decodeInventory(p []byte) (invRecord, error) {
	var r invRecord
	if err := json.Unmarshal(p, &r); err != nil {
		return r, fmt.Errorf("inventory: %w", err)
	}
	if err := r.validate(); err != nil {
		return r, fmt.Errorf("%w: %w", errInvalid, err)
	}
	return r, nil
}

func decodeWant(p []byte) (wantMsg, error) {
	var m wantMsg
	if err := json.Unmarshal(p, &m); err != nil {
		return m, fmt.Errorf("want: %w", err)
	}
	if err := desired.ValidateNodeName(m.From); err != nil {
		return m, fmt.Errorf("%w: want: from: %w", errInvalid, err)
	}
	if len(m.Nodes) == 0 || len(m.Nodes) > maxDigest {
		return m, fmt.Errorf("%w: want: %d names: want 1..%d", errInvalid, len(m.Nodes), maxDigest)
	}
	for _, n := range m.Nodes {
		if err := desired.ValidateNodeName(n); err != nil {
			return m, fmt.Errorf("%w: want: %w", errInvalid, err)
		}
	}
	return m, nil
}

func decodeBye(p []byte) (byeMsg, error) {
	var m byeMsg
	if err := json.Unmarshal(p, &m); err != nil {
		return m, fmt.Errorf("bye: %w", err)
	}
	if err := desired.ValidateNodeName(m.Node); err != nil {
		return m, fmt.Errorf("%w: bye: %w", errInvalid, err)
	}
	return m, nil
}

func decodeInventories(p []byte) (inventoriesMsg, error) {
	var m inventoriesMsg
	if err := json.Unmarshal(p, &m); err != nil {
		return m, fmt.Errorf("inventories: %w", err)
	}
	if len(m.Records) > maxDigest {
		return m, fmt.Errorf("%w: inventories: %d records, at most %d", errOversize, len(m.Records), maxDigest)
	}
	return m, nil
}

func decodeState(p []byte) (stateMsg, error) {
	var m stateMsg
	if err := json.Unmarshal(p, &m); err != nil {
		return m, fmt.Errorf("state: %w", err)
	}
	if err := desired.ValidateNodeName(m.From); err != nil {
		return m, fmt.Errorf("%w: state: from: %w", errInvalid, err)
	}
	if len(m.Records) > maxRecords || len(m.Digest) > maxDigest {
		return m, fmt.Errorf("%w: state: %d records and %d digest entries, at most %d and %d", errOversize, len(m.Records), len(m.Digest), maxRecords, maxDigest)
	}
	for n, v := range m.Digest {
		if err := desired.ValidateNodeName(n); err != nil {
			return m, fmt.Errorf("%w: state: digest: %w", errInvalid, err)
		}
		if v == 0 {
			return m, fmt.Errorf("%w: state: digest: node %q at version 0", errInvalid, n)
		}
	}
	if m.Self != nil {
		if err := m.Self.validate(); err != nil {
			return m, fmt.Errorf("%w: state: %w", errInvalid, err)
		}
		if m.Self.Inv == nil || m.Self.Node != m.From {
			return m, fmt.Errorf("%w: state: sender's own inventory must be complete and its own", errInvalid)
		}
	}
	return m, nil
}
