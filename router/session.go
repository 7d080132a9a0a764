package router

import (
	"cmp"

	"github.com/cespare/xxhash/v2"
)

// sessionID is what the session strategy pins by: the session header's
// value, else the body's user field (HyperPod's "session" strategy reads a
// session from either), keyed with the fleet's hash key so replicas agree
// and callers cannot aim a session at a chosen backend without it. 0: the
// request names no session.
func (rt *Router) sessionID(header, user string) uint64 {
	id := cmp.Or(header, user)
	if id == "" {
		return 0
	}
	return cmp.Or(rt.opts.HashKey.Sum2(0x5e5510, xxhash.Sum64String(id)), 1)
}
