// Package kvevents follows the KV-cache events that inference engines
// publish and keeps an exact index of which backend holds which KV blocks,
// so the router can send a prompt to the backend that already holds the
// longest run of its leading blocks.
//
// # Wire format
//
// vLLM (vllm/distributed/kv_events.py, ZmqEventPublisher) publishes on a
// ZMQ PUB socket, bound when its endpoint is a wildcard (tcp://*:5557) and
// connected otherwise. Each message has three frames: a topic (llm-d uses
// "kv@POD@MODEL"), the batch's sequence number as 8 bytes big-endian, and
// a msgpack KVEventBatch. The batch is msgspec array_like:
// [ts, [event...], data_parallel_rank?]. Events are tagged unions,
// array-encoded with the tag first:
//
//	["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size, lora_id|nil, medium|nil, ...]
//	["BlockRemoved", block_hashes, medium|nil, ...]
//	["AllBlocksCleared"]
//
// or map-encoded (vLLM's newer named-field format) as
// {"type": "BlockStored", "block_hashes": [...], ...}. A block hash is an
// int (vLLM's default: the last 8 bytes of the block's hash, big-endian)
// or the raw hash bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), which
// this package reduces the same way. Fields past the known ones (lora_name,
// extra_keys, group_idx, ...) are skipped, and so are events of unknown
// type, so newer engines keep working. The Go side follows what llm-d's
// decoder (llm-d-kv-cache, pkg/kvevents/engineadapter/vllm_adapter.go) and
// publisher (llm-d-inference-sim, pkg/kv-cache/kv_cache_sender.go and
// pkg/common/publisher.go) do for the same messages.
//
// Each backend has its own Subscriber and address: sequence numbers are
// per publisher, so two engines on one address would read as endless
// gaps and restarts (Subscriber.Topic filters out another engine's
// messages when the topic is known).
//
// # Bounds
//
// Everything from the wire is bounded (Limits): the transport cuts a
// connection at the first ZMTP frame over the frame limit or a message of
// too many frames, before zmq4 allocates it; the decoder checks every
// claimed length against the limits and the bytes left; the Index holds at
// most Limits.MaxBlocks blocks per backend. A bad message is counted and
// its first occurrence of each kind logged; it never stops the stream.
//
// # Trust
//
// A backend's view is used only while trusted: its stream is up, and
// every batch since a known-empty cache (the engine's first batch, or an
// AllBlocksCleared) was applied, or a resync window has passed since the
// view was last cleared. A sequence gap clears the view and starts the
// window; a sequence that goes back (the engine restarted) clears it; a
// lost connection clears it at the next batch, since the engine may have
// restarted meanwhile; a view that outgrows its bound is cleared and waits
// out the window. A
// cleared view only ever holds blocks stored since, so it never points the
// router at blocks the engine dropped.
//
// # Block hashes
//
// Matching a prompt needs the engine's hashes for the prompt's blocks. The
// Index answers for a chain of hashes the caller computed; this package
// does not compute them, because they depend on the engine: vLLM hashes
// each block with sha256 over a CBOR encoding seeded by PYTHONHASHSEED
// (random when unset), while llm-d's simulator uses FNV-64a over canonical
// CBOR seeded by its --hash-seed and the model name.
package kvevents
