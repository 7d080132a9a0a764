package p2p

import "context"

// bufPool bounds and recycles the node's receive buffers. Peer connections
// come and go with every shard, and each used to allocate its own buffers;
// one pool shared by all connections bounds what receiving can hold however
// many peers and shards are open (per-connection buffers allowed 2 MiB per
// connection, ~110 MiB at 8 shards x 7 peers) and reuses it. The daemons'
// measured peak RSS did not move much (93-135 MiB before, 96-118 MiB after,
// 8 hosts, noisy): the bound is the point, not a figure. Uploads that
// cannot sendfile take their copy buffers from a pool of their own, one
// buffer per upload slot, for the same reason.
type bufPool struct {
	slots chan struct{} // one per buffer that may exist
	free  chan []byte
	size  int // of every buffer
}

// newBufPool returns a pool of at most n buffers of size bytes.
func newBufPool(n, size int) *bufPool {
	return &bufPool{slots: make(chan struct{}, n), free: make(chan []byte, n), size: size}
}

// get returns a free buffer, allocating one while under the bound, or
// waits for one to be put back.
func (p *bufPool) get(ctx context.Context) ([]byte, error) {
	select {
	case b := <-p.free:
		return b, nil
	default:
	}
	select {
	case b := <-p.free:
		return b, nil
	case p.slots <- struct{}{}:
		return make([]byte, p.size), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// put returns a buffer from get; it never blocks.
func (p *bufPool) put(b []byte) { p.free <- b[:cap(b)] }
