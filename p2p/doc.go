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
// a restart resumes without rehashing. A follower that asks a shard's
// origin for its manifest before the origin opened the shard may have the
// ask held until it does (WaitManifest), so it subscribes as the shard
// opens rather than a poll later; a member holds a bounded number of such
// asks, each for a bounded time. A node free of its own origin work
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
// and only then one of the members' slots (MaxConns). A node dialing keeps
// its own handshakes towards each member within half that per-address
// share (see dialGate): fetches starting together would otherwise be
// refused by the member as a stranger's flood is.
//
// Every member holds the cluster key, so the key proves membership, not
// which member. Each node also has an ed25519 identity key of its own
// (LoadIdentity keeps it in the data directory), and the handshake
// (version 4, see handshake.go) has both sides prove both: an HMAC under
// the cluster key and a signature with the identity key, over a transcript
// of both fresh nonces, both node IDs and keys, the cluster key's ID, the
// node the dialer means to reach, and over TLS the TLS session itself. A
// recorded handshake replays nowhere, and a member cannot pass another's
// handshake through as its own (over TLS the sessions differ; in plaintext
// the dialer names the member it dialed, NamedPeerSource). A node ID counts
// only with the key it is pinned to: Config.PeerKeys (the daemon's gossip
// pins each member's name to the first key it announces) or, without one,
// the first key this node saw for it. Bans and the one-connection-per-peer
// rule hold the proven key, so a member claiming another's ID is refused in
// the handshake, cannot take its place, and cannot get it banned. A peer
// speaking another handshake version is told which version this node
// speaks, and the connection ends at once.
//
// Config.Encrypt (the daemon's default) runs the handshake and everything
// after inside TLS 1.3. TLS only encrypts: its certificates are throwaway
// and unchecked, because the handshake inside it authenticates both ends
// and is bound to the session, so encrypted connections follow a key
// rotation like plaintext ones. In
// plaintext the handshake authenticates both ends the same way, but an
// attacker on the path can read the pieces and take over the connection
// afterwards; a piece it alters still fails its hash, but gets the member
// it came through banned.
//
// A member connection outlives the exchange it was dialed for (see
// memberconn.go): a manifest ask, a subscription answered "not open here",
// or one the downloader left once its shard was complete, is followed by
// the next exchange with that member on the same connection, so a warming
// node pays a TLS and an identity handshake per connection it needs at
// once, not per shard and retry.
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
