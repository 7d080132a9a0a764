package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	imagecache "github.com/warmfleet/warmfleet/containerd"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/desired"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/spec"
)

// ImageCache is what the daemon needs from the containerd image cache.
type ImageCache interface {
	Ensure(ctx context.Context, ref, owner string) (imagecache.Status, error)
	Release(ctx context.Context, ref, owner string) (imagecache.Released, error)
	List(ctx context.Context) ([]imagecache.Status, error)
	Sweep(ctx context.Context) ([]string, error)
}

// claim is one owner's hold on one (normalized) image reference.
type claim struct{ ref, owner string }

// imageWorld is what the image decision looks at.
type imageWorld struct {
	desired  map[claim]bool
	held     map[claim]bool // owner labels present in containerd
	running  map[claim]bool
	failures map[claim]imageFailure
	checked  map[claim]time.Time // last successful Ensure
	now      time.Time
	resync   time.Duration
}

type imageFailure struct {
	err      string
	attempts int
	nextTry  time.Time
}

// planImages decides which claims to pull (or re-check for a moved tag) and
// which to release. Image caching never blocks anything else: failures are
// retried with backoff and only reported.
func planImages(w imageWorld) (ensure, release []claim) {
	for c := range w.desired {
		if w.running[c] {
			continue
		}
		if f, failed := w.failures[c]; failed && w.now.Before(f.nextTry) {
			continue
		}
		last, checked := w.checked[c]
		if !w.held[c] || !checked || (w.resync > 0 && w.now.Sub(last) >= w.resync) {
			ensure = append(ensure, c)
		}
	}
	for c := range w.held {
		if !w.desired[c] && !w.running[c] {
			release = append(release, c)
		}
	}
	less := func(s []claim) {
		sort.Slice(s, func(i, j int) bool {
			return s[i].ref < s[j].ref || s[i].ref == s[j].ref && s[i].owner < s[j].owner
		})
	}
	less(ensure)
	less(release)
	return ensure, release
}

// images runs the image side of the reconcile loop.
type images struct {
	cache ImageCache

	mu       sync.Mutex
	running  map[claim]bool
	failures map[claim]imageFailure
	checked  map[claim]time.Time
	last     []imagecache.Status // from the last List
	swept    time.Time
}

// useImageCache enables image pre-pulls through c (Deps.Images).
func (d *Daemon) useImageCache(c ImageCache) {
	d.images = &images{cache: c, running: map[claim]bool{}, failures: map[claim]imageFailure{}, checked: map[claim]time.Time{}}
}

func (d *Daemon) reconcileImages(ctx context.Context, targeted func(spec.Spec) bool) error {
	im := d.images
	if im == nil {
		return nil
	}
	desired := map[claim]bool{}
	for _, s := range d.desired.List() {
		if s.Kind != spec.KindImage || !targeted(s) {
			continue
		}
		ref, err := imagecache.NormalizeRef(s.Name)
		if err != nil {
			continue // Validate let it through but containerd would not: reported by AddImage
		}
		desired[claim{ref, s.Owner}] = true
	}
	statuses, err := im.cache.List(ctx)
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	held := map[claim]bool{}
	for _, st := range statuses {
		for _, o := range st.Owners {
			held[claim{st.Ref, o}] = true
		}
	}
	im.mu.Lock()
	im.last = statuses
	w := imageWorld{desired: desired, held: held, running: maps.Clone(im.running), failures: maps.Clone(im.failures),
		checked: maps.Clone(im.checked), now: d.now(), resync: d.cfg.ResyncInterval}
	ensure, release := planImages(w)
	for _, c := range ensure {
		im.running[c] = true
	}
	sweep := len(release) > 0 || d.now().Sub(im.swept) > time.Hour
	im.mu.Unlock()

	for _, c := range ensure {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.ensureImage(ctx, c)
		}()
	}
	var errs []error
	for _, c := range release {
		rel, err := im.cache.Release(ctx, c.ref, c.owner)
		if err != nil {
			errs = append(errs, fmt.Errorf("release %s for %s: %w", c.ref, c.owner, err))
			continue
		}
		d.log.Info("image released", "ref", c.ref, "owner", c.owner, "removed", rel.Removed, "reason", rel.Reason)
		im.mu.Lock()
		delete(im.checked, c)
		delete(im.failures, c)
		im.mu.Unlock()
	}
	if sweep {
		if removed, err := im.cache.Sweep(ctx); err != nil {
			errs = append(errs, fmt.Errorf("sweep images: %w", err))
		} else {
			if len(removed) > 0 {
				d.log.Info("unused images removed", "refs", removed)
			}
			im.mu.Lock()
			im.swept = d.now()
			im.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}

func (d *Daemon) ensureImage(ctx context.Context, c claim) {
	im := d.images
	st, err := im.cache.Ensure(ctx, c.ref, c.owner)
	im.mu.Lock()
	defer im.mu.Unlock()
	delete(im.running, c)
	if err != nil {
		f := im.failures[c]
		f.attempts++
		f.err, f.nextTry = err.Error(), d.now().Add(retryDelay(f.attempts))
		im.failures[c] = f
		d.log.Warn("image pull failed", "ref", c.ref, "owner", c.owner, "err", err, "attempts", f.attempts, "retry_at", f.nextTry)
	} else {
		delete(im.failures, c)
		im.checked[c] = d.now()
		d.log.Info("image cached", "ref", c.ref, "owner", c.owner, "digest", st.Digest)
	}
	d.Kick()
}

// Images reports the node's images: what containerd holds plus the claims
// that are pending or failing.
func (d *Daemon) Images(ctx context.Context) ([]api.ImageStatus, error) {
	im := d.images
	if im == nil {
		return nil, ErrImagesOff
	}
	statuses, err := im.cache.List(ctx)
	if err != nil {
		return nil, err
	}
	wanted := map[string][]string{}
	targeted := d.targeter()
	for _, s := range d.desired.List() {
		if s.Kind != spec.KindImage || !targeted(s) {
			continue
		}
		if ref, err := imagecache.NormalizeRef(s.Name); err == nil {
			wanted[ref] = append(wanted[ref], s.Owner)
		}
	}
	byRef := map[string]api.ImageStatus{}
	for _, st := range statuses {
		byRef[st.Ref] = api.ImageStatus{
			Ref: st.Ref, Digest: st.Digest, Size: st.Size, Owners: st.Owners, Managed: st.Managed, Unpacked: st.Unpacked,
			State: string(st.State), BytesDone: st.BytesDone, BytesTotal: st.BytesTotal, Error: st.Error,
		}
	}
	im.mu.Lock()
	for c, f := range im.failures {
		if _, ok := byRef[c.ref]; !ok && slices.Contains(wanted[c.ref], c.owner) {
			byRef[c.ref] = api.ImageStatus{Ref: c.ref, State: string(imagecache.StateFailed), Error: f.err}
		}
	}
	for c := range im.running {
		if _, ok := byRef[c.ref]; !ok {
			byRef[c.ref] = api.ImageStatus{Ref: c.ref, State: string(imagecache.StatePulling)}
		}
	}
	im.mu.Unlock()
	for ref, owners := range wanted {
		st, ok := byRef[ref]
		if !ok {
			st = api.ImageStatus{Ref: ref, State: "pending"}
		}
		slices.Sort(owners)
		st.Wanted = owners
		byRef[ref] = st
	}
	out := make([]api.ImageStatus, 0, len(byRef))
	for _, ref := range slices.Sorted(maps.Keys(byRef)) {
		out = append(out, byRef[ref])
	}
	return out, nil
}

// imageInventory is the images part of the node's inventory, from the last
// listing (refreshed every reconcile).
func (d *Daemon) imageInventory() map[string]gossip.ImageInventory {
	im := d.images
	if im == nil {
		return nil
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	out := make(map[string]gossip.ImageInventory, len(im.last))
	for _, st := range im.last {
		state := gossip.StateDownloading
		switch st.State {
		case imagecache.StateReady:
			state = gossip.StateReady
		case imagecache.StateFailed:
			state = gossip.StateFailed
		}
		out[st.Ref] = gossip.ImageInventory{Digest: st.Digest, State: state, BytesDone: st.BytesDone, BytesTotal: st.BytesTotal}
	}
	return out
}

// ErrImagesOff is the answer to an image command on a node whose image
// cache is off: its API takes no image claims, which it could neither pull
// nor report on (`image ls` would then fail where `image add` succeeded).
var ErrImagesOff = errors.New("image cache is off on this node: start the daemon with --containerd unix:///run/containerd/containerd.sock " +
	"(it is off with --containerd off, or when no containerd socket was found at start), or run the command against a node whose image cache is on")

// AddImage records an image claim in the fleet's desired state, under the
// normalized reference: "alpine" and "docker.io/library/alpine:latest" are
// one claim, shown and removed by the name `image ls` prints.
func (d *Daemon) AddImage(ctx context.Context, s spec.Spec) error {
	ref, err := imagecache.NormalizeRef(s.Name)
	if err != nil {
		return err
	}
	s.Name = ref
	if err := imagecache.ValidateOwner(s.Owner); err != nil {
		return err
	}
	if err := d.desired.Put(ctx, s); err != nil {
		return err
	}
	d.Kick()
	return nil
}

// RemoveImage drops an owner's claim fleet-wide, however its reference was
// spelled when added; found is false when there was none.
func (d *Daemon) RemoveImage(ctx context.Context, ref, owner string) (bool, error) {
	keys := []string{spec.Spec{Kind: spec.KindImage, Name: ref, Owner: owner}.Key()}
	if norm, err := imagecache.NormalizeRef(ref); err == nil {
		for _, s := range d.desired.List() {
			if s.Kind != spec.KindImage || s.Owner != owner || s.Name == ref {
				continue
			}
			if n, err := imagecache.NormalizeRef(s.Name); err == nil && n == norm {
				keys = append(keys, s.Key())
			}
		}
	}
	var found bool
	for _, key := range keys {
		err := d.desired.Delete(ctx, key)
		if errors.Is(err, desired.ErrNotFound) {
			continue
		}
		if err != nil {
			return found, err
		}
		found = true
	}
	if found {
		d.Kick()
	}
	return found, nil
}
