package p2p

// pickState is what piece selection looks at; the fetch keeps it under its
// lock.
type pickState struct {
	have     Bitfield // verified locally
	inflight []bool   // requested from a peer or the origin
	avail    []int32  // number of connected peers that have each piece
}

// pickRarest returns the needed piece that the peer has and the fewest other
// peers have, choosing at random among equally rare ones so that
// downloaders spread over different pieces; -1 if the peer has nothing we
// need. intn(k) must return a number in [0, k).
func pickRarest(st *pickState, peerHas Bitfield, intn func(int) int) int {
	best, ties := -1, 0
	var bestAvail int32
	for i := range st.inflight {
		if st.inflight[i] || st.have.Has(i) || !peerHas.Has(i) {
			continue
		}
		a := st.avail[i]
		switch {
		case best < 0 || a < bestAvail:
			best, bestAvail, ties = i, a, 1
		case a == bestAvail:
			ties++
			if intn(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// pickForOrigin returns a needed piece that no connected peer has, in file
// order so the origin's reads stream forward; -1 if none.
func pickForOrigin(st *pickState) int {
	for i := range st.inflight {
		if !st.inflight[i] && !st.have.Has(i) && st.avail[i] == 0 {
			return i
		}
	}
	return -1
}

// helpGap is how far past the origin's run a helper may read: the origin
// learns of a helper's piece only once it is in, so a helper that read the
// piece the origin reaches next would have read it for nothing. Four pieces
// take the origin four piece times to reach, the helper one.
const helpGap = 4

// pickForHelper returns a piece for a node that helps a shard's origin
// read S3: the last needed piece of its stripe (stripe of stripes, counted
// back from the shard's end, so helpers never pick the same piece) that no
// connected peer has, at least helpGap pieces past the run of pieces
// present here or at a peer from the start, where the origin reads
// forward; -1 if none.
func pickForHelper(st *pickState, stripe, stripes int) int {
	np := len(st.inflight)
	if stripes <= 0 || stripe < 0 || stripe >= stripes {
		return -1
	}
	front := 0
	for front < np && (st.have.Has(front) || st.avail[front] > 0) {
		front++
	}
	for i := np - 1 - stripe; i >= front+helpGap; i -= stripes {
		if !st.inflight[i] && !st.have.Has(i) && st.avail[i] == 0 {
			return i
		}
	}
	return -1
}

// allStarted reports whether every piece is verified or being fetched.
func (st *pickState) allStarted() bool {
	for i := range st.inflight {
		if !st.inflight[i] && !st.have.Has(i) {
			return false
		}
	}
	return true
}
