// Package p2p moves model shards between warmfleet nodes.
//
// A shard is a byte range of one file, described by a Manifest that lists a
// hash per piece. A shard may be open before its manifest is complete: its
// origin (Build) learns each hash as it reads the piece from S3, and every
// piece travels with its hash, so the fleet receives pieces while the origin
// is still reading. A Node listens for fleet members (authenticated with the
// shared cluster key), serves the verified pieces of every shard it has
// opened, and fills shards from peers and, when allowed, from an origin byte
// source such as S3. Pieces are streamed straight to their offset in the
// final file and only counted as present once their hash matches the
// manifest; completion is persisted in batches after fdatasync so
// a restart resumes without rehashing. A node free of its own origin work
// may help an origin (FetchOptions.OriginHelp), reading from the shard's end
// the pieces of its stripe no peer has; a fetch can also take a CRC of each
// piece from the bytes it verified (FetchOptions.PieceCRC), so the whole
// file is checked against its object without reading it back. A shard ID
// opened again at another path (the same content cached under another
// name) is a twin: it copies each piece from the first file as that one
// verifies it, and serves the shard once the first closes.
//
// The peer port is open to anyone who reaches it: a connection holds one of
// a few handshake slots (Config.MaxHandshakes, a share per source address)
// until its handshake proves the cluster key or HandshakeTimeout cuts it,
// and only then one of the members' slots (MaxConns).
//
// The bulk data plane is a small range-request protocol rather than the
// BitTorrent wire protocol: the sender uses sendfile, and on plain TCP the
// receiver splices piece bodies from the socket into the (preallocated)
// file and hashes each piece from the page cache before counting it, one
// kernel copy and one hash per byte; over TLS it reads, hashes and writes
// buffers. That keeps it at or above the speed of a plain HTTP copy at
// under a core-second per GiB (see internal/bench).
// Manifests using SHA-1 can still be expressed as a BitTorrent v1 info dict.
package p2p
