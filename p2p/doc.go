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
// final file, hashed on the way, and only counted as present once their hash
// matches the manifest; completion is persisted in batches after fdatasync so
// a restart resumes without rehashing.
//
// The bulk data plane is a small range-request protocol rather than the
// BitTorrent wire protocol: on loopback it moves bytes with sendfile on the
// sender and one copy plus one hash on the receiver, which is what keeps it
// at or above the speed of a plain HTTP copy (see internal/bench).
// Manifests using SHA-1 can still be expressed as a BitTorrent v1 info dict.
package p2p
