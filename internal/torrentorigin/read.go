package torrentorigin

import (
	"bytes"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/anacrolix/torrent"
	"golang.org/x/sync/errgroup"

	"github.com/warmfleet/warmfleet/origin"
)

// acquire finds obj's torrent, loading it from its kept metadata if need
// be, and counts a reader on it until release.
func (o *Origin) acquire(obj origin.Object) (*entry, span, error) {
	e, err := o.loaded(obj.VersionID)
	if err != nil {
		return nil, span{}, err
	}
	if e == nil {
		return nil, span{}, fmt.Errorf("%s: %w: torrent %s was never listed on this node", obj.Key, origin.ErrNotFound, obj.VersionID)
	}
	f, err := e.l.file(obj)
	if err != nil {
		return nil, span{}, err
	}
	o.mu.Lock()
	e.active++
	o.mu.Unlock()
	return e, f, nil
}

func (o *Origin) release(e *entry) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e.active--
	e.used = o.opts.Clock()
}

// OpenRange streams n bytes of obj at off, each from a piece that passed
// its hash check.
func (o *Origin) OpenRange(ctx context.Context, obj origin.Object, off, n int64) (io.ReadCloser, error) {
	e, f, err := o.acquire(obj)
	if err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || off+n > f.length {
		o.release(e)
		return nil, fmt.Errorf("%s: range %d+%d outside its %d bytes", obj.Key, off, n, f.length)
	}
	return o.openAt(ctx, e, f.off+off, n, true), nil
}

// openAt reads n bytes of e's torrent at torrent offset off; count says
// whether they are origin bytes (OnBytes). Closing it releases e.
func (o *Origin) openAt(ctx context.Context, e *entry, off, n int64, count bool) *rangeReader {
	r := e.t.NewReader()
	// The pieces of the whole range are asked for at once, up to a bound:
	// a shard's range is read in one go.
	r.SetReadahead(min(n, 64<<20))
	rr := &rangeReader{o: o, e: e, r: r, ctx: ctx, off: off, left: n, count: count}
	if _, err := r.Seek(off, io.SeekStart); err != nil {
		rr.err = err
	}
	return rr
}

// rangeReader reads a torrent range; a read that waits longer than
// StallTimeout for its piece fails.
type rangeReader struct {
	o     *Origin
	e     *entry
	r     torrent.Reader
	ctx   context.Context
	off   int64 // torrent offset of the next byte
	left  int64
	count bool
	err   error
	done  bool
}

func (rr *rangeReader) Read(p []byte) (int, error) {
	if rr.err != nil {
		return 0, rr.err
	}
	if rr.left <= 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), rr.left)]
	n, err := rr.wait(p)
	rr.left -= int64(n)
	rr.off += int64(n)
	if n > 0 && rr.count {
		rr.o.opts.OnBytes(n)
	}
	switch {
	case n > 0 && (err == nil || errors.Is(err, io.EOF)):
		return n, nil
	case err == nil:
		return 0, nil
	case rr.ctx.Err() != nil:
		rr.err = context.Cause(rr.ctx)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, errHopeless):
		rr.err = rr.stalled(errors.Is(err, errHopeless))
	case errors.Is(err, io.EOF):
		rr.err = fmt.Errorf("%w: torrent %s ended %d bytes early", origin.ErrServer, rr.e.l.infoHash, rr.left)
	default:
		rr.err = fmt.Errorf("torrent %s at %d: %w", rr.e.l.infoHash, rr.off, err)
	}
	return n, rr.err
}

// hopeCheck is how often a read that waits for a piece asks whether any
// peer is left that could deliver it.
const hopeCheck = time.Second

// errHopeless ends a wait no peer is left to serve.
var errHopeless = errors.New("no peer left to try")

// wait reads into p, waiting at most StallTimeout for the next verified
// piece, and less once every peer that had it has been banned for bad
// data: a swarm whose only seeders corrupt fails now, not minutes later.
func (rr *rangeReader) wait(p []byte) (int, error) {
	waited := time.Duration(0)
	for {
		slice := min(rr.o.opts.StallTimeout-waited, hopeCheck)
		ctx, cancel := context.WithTimeout(rr.ctx, slice)
		n, err := rr.r.ReadContext(ctx, p)
		cancel()
		if n > 0 || !errors.Is(err, context.DeadlineExceeded) || rr.ctx.Err() != nil {
			return n, err
		}
		if waited += slice; waited >= rr.o.opts.StallTimeout {
			return 0, err
		}
		if rr.o.hopeless(rr.e) {
			return 0, errHopeless
		}
	}
}

// hopeless tells whether no peer is left that could deliver e's pieces:
// some sent data that failed the hash check, and every peer the client
// knows of (connected, being dialled or waiting to be) is banned for it.
// A torrent with web seeds always has one to try.
func (o *Origin) hopeless(e *entry) bool {
	st := e.t.Stats()
	if st.PiecesDirtiedBad.Int64() == 0 || st.ActivePeers > 0 || st.HalfOpenPeers > 0 {
		return false
	}
	if o.opts.WebSeeds && len(e.t.Metainfo().UrlList) > 0 {
		return false
	}
	o.mu.Lock()
	cl := o.cl
	o.mu.Unlock()
	banned := cl.BadPeerIPs()
	for _, p := range e.t.KnownSwarm() {
		ap, err := netip.ParseAddrPort(p.Addr.String())
		if err != nil || !slices.Contains(banned, ap.Addr().String()) {
			return false
		}
	}
	return true
}

// stalled explains a read that got no verified piece in StallTimeout, or
// that no peer is left to try (hopeless).
func (rr *rangeReader) stalled(hopeless bool) error {
	st := rr.e.t.Stats()
	piece := rr.off / rr.e.l.pieceLength
	bad := st.PiecesDirtiedBad.Int64()
	switch {
	case hopeless:
		return fmt.Errorf("%w: torrent %s: no good copy of piece %d: every peer that sent data failing the torrent's SHA-1 check is banned, and none other is left to try (bad pieces: %d)",
			origin.ErrCorrupt, rr.e.l.infoHash, piece, bad)
	case bad > 0:
		return fmt.Errorf("%w: torrent %s: no good copy of piece %d in %v: a peer sent data failing the torrent's SHA-1 check (bad pieces: %d; peers connected: %d)",
			origin.ErrCorrupt, rr.e.l.infoHash, piece, rr.o.opts.StallTimeout, bad, st.ActivePeers)
	}
	return fmt.Errorf("%w: torrent %s: no peer delivered piece %d in %v (%d peers connected)",
		origin.ErrUnreachable, rr.e.l.infoHash, piece, rr.o.opts.StallTimeout, st.ActivePeers)
}

func (rr *rangeReader) Close() error {
	if rr.done {
		return nil
	}
	rr.done = true
	err := rr.r.Close()
	rr.o.release(rr.e)
	return err
}

// Download writes obj into dst in parts, then checks it piece by piece.
func (o *Origin) Download(ctx context.Context, obj origin.Object, dst origin.File, plan origin.Plan) error {
	e, f, err := o.acquire(obj)
	if err != nil {
		return err
	}
	defer o.release(e)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.opts.Concurrency)
	for part := range origin.Parts(f.length, o.opts.PartSize) {
		if plan.Done != nil && plan.Done(part) {
			continue
		}
		g.Go(func() error {
			off, n := origin.PartRange(part, f.length, o.opts.PartSize)
			o.mu.Lock()
			e.active++
			o.mu.Unlock()
			rr := o.openAt(gctx, e, f.off+off, n, true)
			defer rr.Close()
			if _, err := io.CopyN(io.NewOffsetWriter(dst, off), rr, n); err != nil {
				return fmt.Errorf("%s: part %d: %w", obj.Key, part, err)
			}
			if plan.OnPart != nil {
				plan.OnPart(part, n)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	v, err := o.check(ctx, e, f, dst)
	if plan.OnVerify != nil {
		plan.OnVerify(v)
	}
	return err
}

// NewRangeCheck is nil: a torrent's digests are SHA-1s of pieces, not CRCs.
func (o *Origin) NewRangeCheck(context.Context, origin.Object) (origin.RangeCheck, error) {
	return nil, nil
}

// Verify checks r, a copy of obj, against the torrent's piece hashes.
func (o *Origin) Verify(ctx context.Context, obj origin.Object, r io.ReaderAt) (origin.Verification, error) {
	e, f, err := o.acquire(obj)
	if err != nil {
		return origin.Verification{Method: "none", Detail: err.Error()}, err
	}
	defer o.release(e)
	return o.check(ctx, e, f, r)
}

// check hashes the pieces of file f, read from r, against the torrent's.
// A piece the file shares with a neighbour is checked when this node holds
// the neighbour's part of it (verified, in the client), else counted
// unchecked: Verified is then false.
func (o *Origin) check(ctx context.Context, e *entry, f span, r io.ReaderAt) (origin.Verification, error) {
	v := origin.Verification{Method: "sha1-pieces"}
	if f.length == 0 {
		v.Verified, v.Detail = true, "empty file"
		return v, nil
	}
	l := e.l
	first, last := int(f.off/l.pieceLength), int((f.off+f.length-1)/l.pieceLength)
	buf := make([]byte, min(l.pieceLength, l.total))
	unchecked := 0
	for i := first; i <= last; i++ {
		if err := ctx.Err(); err != nil {
			return v, err
		}
		poff, pn := l.pieceRange(i)
		b := buf[:pn]
		lo, hi := max(poff, f.off), min(poff+pn, f.off+f.length)
		if (lo > poff || hi < poff+pn) && !o.neighbours(ctx, e, i, poff, b) {
			unchecked++
			continue
		}
		if _, err := r.ReadAt(b[lo-poff:hi-poff], lo-f.off); err != nil {
			if errors.Is(err, io.EOF) {
				return v, fmt.Errorf("%s: %w: shorter than its %d bytes", f.key, origin.ErrCorrupt, f.length)
			}
			return v, fmt.Errorf("%s: read the copy: %w", f.key, err)
		}
		if sum := sha1.Sum(b); !bytes.Equal(sum[:], l.hashes[20*i:20*i+20]) {
			v.Detail = fmt.Sprintf("piece %d (file bytes %d..%d) does not match the torrent's SHA-1", i, lo-f.off, hi-f.off)
			return v, fmt.Errorf("%s: %w: %s", f.key, origin.ErrCorrupt, v.Detail)
		}
	}
	n := last - first + 1
	v.Verified = unchecked == 0
	v.Detail = fmt.Sprintf("%d pieces of torrent %s", n, l.infoHash)
	if unchecked > 0 {
		v.Detail = fmt.Sprintf("%d of %d pieces of torrent %s checked; %d shared with a neighbouring file not held here (checked by the node that fetched them)", n-unchecked, n, l.infoHash, unchecked)
	}
	return v, nil
}

// neighbours fills b, piece i at torrent offset off, from the client when
// it holds the piece verified; false when it does not.
func (o *Origin) neighbours(ctx context.Context, e *entry, i int, off int64, b []byte) bool {
	if !e.t.Piece(i).State().Complete {
		return false
	}
	o.mu.Lock()
	e.active++
	o.mu.Unlock()
	rr := o.openAt(ctx, e, off, int64(len(b)), false)
	defer rr.Close()
	_, err := io.ReadFull(rr, b)
	return err == nil
}

// janitor drops torrents dropNow says are done, every minute or so.
func (o *Origin) janitor(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(min(time.Minute, o.opts.IdleDrop/2))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			o.sweep()
		}
	}
}

// sweep drops the torrents that are done and deletes their data.
func (o *Origin) sweep() {
	now := o.opts.Clock()
	o.mu.Lock()
	var gone []*entry
	for ih, e := range o.torrents {
		stats := e.t.Stats()
		st := useState{Active: e.active, Added: e.added, Used: e.used, Length: e.l.total,
			Uploaded: stats.BytesWrittenData.Int64()}
		if dropNow(st, now, o.opts) {
			delete(o.torrents, ih)
			gone = append(gone, e)
		}
	}
	o.mu.Unlock()
	for _, e := range gone {
		e.t.Drop()
		<-e.t.Closed()
		if err := os.RemoveAll(o.dataPath(e.l.infoHash)); err != nil {
			o.opts.Logger.Warn("delete torrent data", "infohash", e.l.infoHash, "err", err)
		}
		o.opts.Logger.Info("torrent dropped", "infohash", e.l.infoHash, "name", e.l.name)
	}
}

// useState is what dropNow decides on.
type useState struct {
	Active           int
	Added, Used      time.Time
	Length, Uploaded int64
}

// dropNow tells whether a torrent is done with: no reader for IdleDrop,
// and, when seeding, it uploaded SeedRatio times its size or has been
// loaded for SeedTime.
func dropNow(s useState, now time.Time, o Options) bool {
	if s.Active > 0 || now.Sub(s.Used) < o.IdleDrop {
		return false
	}
	if !o.Seed {
		return true
	}
	return float64(s.Uploaded) >= o.SeedRatio*float64(s.Length) || now.Sub(s.Added) >= o.SeedTime
}
