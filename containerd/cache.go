// Package imagecache pre-pulls container images into containerd (the
// namespace kubelet uses, unpacked into its snapshotter) so a pod finds its
// image already there, shares one copy among every owner that asked for it,
// and removes it when the last owner is gone — only if warmfleet pulled it
// and no container uses it.
//
// All durable state is in containerd's image labels (see LabelManaged and
// LabelOwnerPrefix); the cache itself only remembers pulls in progress and
// failures. Pulls use client.Pull, not the transfer service, so containerd
// 1.6 works as well as 2.x.
package imagecache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/moby/locker"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Cache. The zero value is usable.
type Options struct {
	// Namespace is the containerd namespace; default "k8s.io", the one
	// kubelet's CRI uses.
	Namespace string
	// Snapshotter to unpack into; default "overlayfs".
	Snapshotter string
	// Platform to pull, such as "linux/amd64"; default this node's.
	Platform string
	// HostsDir is a containerd hosts directory (the layout of
	// /etc/containerd/certs.d: HOST/hosts.toml); empty uses defaults
	// (https, or http for loopback registries).
	HostsDir string
	// DockerConfig is the path of a docker config.json with registry
	// credentials; empty means none. The file is read at every pull, so
	// rotated credentials apply without a restart.
	DockerConfig string
	// DisableECR turns off fetching Amazon ECR tokens through the AWS
	// default credential chain for *.dkr.ecr.*.amazonaws.com hosts.
	DisableECR bool
	// Registerer receives the warmfleet_image_* metrics; nil skips
	// registration.
	Registerer prometheus.Registerer
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock for owner timestamps and status; nil means
	// time.Now.
	Now func() time.Time
}

// State of an image in the cache.
type State string

const (
	StatePulling State = "pulling"
	StateReady   State = "ready"
	StateFailed  State = "failed"
)

// Status describes one image: what containerd holds and what the cache is
// doing with it.
type Status struct {
	// Ref is the normalized reference (the containerd image name).
	Ref string `json:"ref"`
	// Digest of the image's manifest or index; empty until pulled.
	Digest string `json:"digest,omitempty"`
	// Size is the content size for this platform (manifest, config and
	// layers as stored, not unpacked).
	Size int64 `json:"size,omitempty"`
	// Owners recorded for the image, sorted.
	Owners []string `json:"owners,omitempty"`
	// Managed is true when warmfleet pulled it and may remove it.
	Managed bool `json:"managed"`
	// Unpacked is true when the layers are in the snapshotter.
	Unpacked bool  `json:"unpacked"`
	State    State `json:"state"`
	// BytesDone and BytesTotal are the running pull's progress: bytes
	// fetched from the registry and the size of config plus layers (known
	// once the manifest is read).
	BytesDone  int64 `json:"bytes_done,omitempty"`
	BytesTotal int64 `json:"bytes_total,omitempty"`
	// Error is the last failure (State failed), or a warning for a ready
	// image (for example: the registry could not be asked whether the tag
	// moved).
	Error string `json:"error,omitempty"`
	// Since is when the current state began.
	Since time.Time `json:"since"`
}

// Cache pre-pulls and reference-counts images in containerd.
type Cache struct {
	client      *client.Client
	ownsClient  bool
	ns          string
	snapshotter string
	platform    platforms.MatchComparer
	hostsDir    string
	dockerCfg   string
	ecr         *ecrTokens
	metrics     *metrics
	log         *slog.Logger
	now         func() time.Time

	clog *log.Entry // containerd client logs, bridged to log

	locks refLocks

	mu       sync.Mutex
	pulls    map[string]*pullState // by ref, while pulling
	failures map[string]*failure   // by ref, last failed pull not yet superseded
}

type pullState struct {
	progress
	since time.Time
	owner string
}

type failure struct {
	err    string
	since  time.Time
	owners map[string]bool
}

// New returns a cache that uses c, which the caller keeps and closes.
func New(c *client.Client, opts Options) (*Cache, error) {
	if c == nil {
		return nil, errors.New("image cache: nil containerd client")
	}
	if opts.Namespace == "" {
		opts.Namespace = "k8s.io"
	}
	if err := identifiers.Validate(opts.Namespace); err != nil {
		return nil, fmt.Errorf("image cache: namespace: %w", err)
	}
	if opts.Snapshotter == "" {
		opts.Snapshotter = "overlayfs"
	}
	platform := platforms.Default()
	if opts.Platform != "" {
		p, err := platforms.Parse(opts.Platform)
		if err != nil {
			return nil, fmt.Errorf("image cache: platform %q: %w", opts.Platform, err)
		}
		platform = platforms.Only(p)
	}
	if opts.HostsDir != "" {
		if st, err := os.Stat(opts.HostsDir); err != nil {
			return nil, fmt.Errorf("image cache: hosts dir: %w", err)
		} else if !st.IsDir() {
			return nil, fmt.Errorf("image cache: hosts dir %s is not a directory", opts.HostsDir)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	ca := &Cache{
		client:      c,
		ns:          opts.Namespace,
		snapshotter: opts.Snapshotter,
		platform:    platform,
		hostsDir:    opts.HostsDir,
		dockerCfg:   opts.DockerConfig,
		metrics:     m,
		log:         opts.Logger.With("component", "imagecache", "namespace", opts.Namespace),
		now:         opts.Now,
		pulls:       map[string]*pullState{},
		failures:    map[string]*failure{},
	}
	ca.clog = containerdLogger(ca.log)
	if !opts.DisableECR {
		ca.ecr = newECRTokens(opts.Now)
	}
	return ca, nil
}

// Dial connects to containerd at address ("unix:///run/containerd/containerd.sock"
// or a plain socket path), checks that it answers, and returns a cache
// that owns the connection (Close closes it).
func Dial(ctx context.Context, address string, opts Options) (*Cache, error) {
	// The client adds the unix:// scheme itself; given twice, gRPC reads
	// "unix:" as the authority and refuses it.
	c, err := client.New(strings.TrimPrefix(address, "unix://"))
	if err != nil {
		return nil, fmt.Errorf("containerd %s: %w", address, err)
	}
	if _, err := c.Version(ctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("containerd %s: not answering: %w", address, err)
	}
	ca, err := New(c, opts)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	ca.ownsClient = true
	return ca, nil
}

// Close closes the containerd connection if Dial opened it.
func (c *Cache) Close() error {
	if c.ownsClient {
		return c.client.Close()
	}
	return nil
}

// Ensure makes ref present and unpacked in containerd and records owner
// for it. It blocks for the whole pull: callers run it in their own
// goroutine and retry failures with backoff; List shows the progress
// meanwhile. An image that was there before warmfleet was asked for it is
// recorded as present but never marked managed. When a tag has moved, the
// new digest is pulled first and the old one released afterwards (removed
// only if warmfleet pulled it and no container uses it).
func (c *Cache) Ensure(ctx context.Context, ref, owner string) (Status, error) {
	if err := ValidateOwner(owner); err != nil {
		return Status{}, err
	}
	name, err := NormalizeRef(ref)
	if err != nil {
		return Status{}, err
	}
	unlock := c.locks.lock(name)
	defer unlock()
	ctx = c.scope(ctx)
	is := c.client.ImageService()

	var existing *images.Image
	if img, err := is.Get(ctx, name); err == nil {
		existing = &img
	} else if !errdefs.IsNotFound(err) {
		return Status{}, fmt.Errorf("image %s: %w", name, err)
	}

	resolver := newResolver(ctx, c.hostsDir, c.credentials)
	if existing != nil {
		upToDate, warn := true, ""
		if !isDigestRef(name) {
			d, err := resolveDigest(ctx, resolver, name)
			switch {
			case err != nil:
				// The image is here; not knowing whether the tag moved
				// must not make it unusable.
				warn = fmt.Sprintf("could not check the registry for a newer digest: %v", classify(err))
			default:
				upToDate = d == existing.Target.Digest.String()
			}
		}
		unpacked, err := client.NewImageWithPlatform(c.client, *existing, c.platform).IsUnpacked(ctx, c.snapshotter)
		if err != nil {
			c.log.Debug("unpack check failed; pulling again", "ref", name, "err", err)
		}
		if upToDate && unpacked {
			img, err := c.claim(ctx, *existing, owner)
			if err != nil {
				return Status{}, err
			}
			c.clearFailure(name)
			c.metrics.pulls.WithLabelValues("present").Inc()
			st := c.status(ctx, img)
			st.Error = warn
			return st, nil
		}
	}

	// Hold the old target while the new one is pulled, so the decision
	// about it is taken after the switch, not by a GC run in between.
	var hold *leases.Lease
	if existing != nil {
		l, err := c.holdContent(ctx, *existing)
		if err != nil {
			return Status{}, err
		}
		hold = &l
	}
	existingLabels := map[string]string(nil)
	if existing != nil {
		existingLabels = existing.Labels
	}
	labels := pullLabels(existingLabels, existing != nil, owner, c.now().UTC().Format(time.RFC3339))
	img, err := c.pull(ctx, name, owner, labels, resolver)
	if err != nil {
		if hold != nil {
			c.releaseHold(ctx, *hold, false)
		}
		return c.failed(name, owner, err), err
	}
	if existing != nil && existing.Target.Digest != img.Target.Digest {
		c.releaseOld(ctx, *existing, *hold)
	} else if hold != nil {
		c.releaseHold(ctx, *hold, false)
	}
	c.clearFailure(name)
	return c.status(ctx, img), nil
}

// scope puts the namespace and the bridged client logger into ctx.
func (c *Cache) scope(ctx context.Context) context.Context {
	return log.WithLogger(namespaces.WithNamespace(ctx, c.ns), c.clog)
}

// pull runs client.Pull with progress tracking and metrics.
func (c *Cache) pull(ctx context.Context, name, owner string, labels map[string]string, resolver remotes.Resolver) (images.Image, error) {
	ps := &pullState{since: c.now(), owner: owner}
	c.mu.Lock()
	c.pulls[name] = ps
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pulls, name)
		c.mu.Unlock()
	}()
	c.metrics.inFlight.Inc()
	defer c.metrics.inFlight.Dec()

	// client.Pull would lease the download itself but release the lease
	// with the caller's context, which fails once that is canceled and
	// leaves partial content held for a day. Our own lease is released
	// regardless.
	ctx, done, err := c.client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(24*time.Hour))
	if err != nil {
		return images.Image{}, fmt.Errorf("pull %s: lease: %w", name, err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := done(ctx); err != nil {
			c.log.Warn("could not release the pull's lease", "ref", name, "err", err)
		}
	}()

	start := time.Now()
	c.log.Info("pulling image", "ref", name, "owner", owner)
	img, err := c.client.Pull(ctx, name,
		client.WithPullUnpack,
		client.WithPullSnapshotter(c.snapshotter),
		client.WithPlatformMatcher(c.platform),
		client.WithResolver(countingResolver{Resolver: resolver, p: &ps.progress, count: func(n int64) { c.metrics.bytes.Add(float64(n)) }}),
		client.WithImageHandlerWrapper(totalFromManifest(&ps.progress)),
		client.WithPullLabels(labels),
	)
	elapsed := time.Since(start)
	c.metrics.duration.Observe(elapsed.Seconds())
	if err != nil {
		// A canceled pull can fail with whatever broke first (a commit
		// that read EOF); the cancellation is the cause to report.
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w: %w", ctxErr, err)
		}
		err = classify(err)
		c.metrics.pulls.WithLabelValues("failed").Inc()
		c.metrics.failures.WithLabelValues(errorReason(err)).Inc()
		c.log.Warn("image pull failed", "ref", name, "owner", owner, "err", err, "duration", elapsed)
		return images.Image{}, fmt.Errorf("pull %s: %w", name, err)
	}
	c.metrics.pulls.WithLabelValues("pulled").Inc()
	c.log.Info("pulled image", "ref", name, "digest", img.Target().Digest, "bytes_fetched", ps.done.Load(), "duration", elapsed)
	return img.Metadata(), nil
}

// claim records owner on an image record that is already current.
func (c *Cache) claim(ctx context.Context, img images.Image, owner string) (images.Image, error) {
	key := OwnerLabel(owner)
	if _, ok := img.Labels[key]; ok {
		return img, nil
	}
	upd := images.Image{Name: img.Name, Labels: map[string]string{key: c.now().UTC().Format(time.RFC3339)}}
	out, err := c.client.ImageService().Update(ctx, upd, "labels."+key)
	if err != nil {
		return images.Image{}, fmt.Errorf("record owner %s on %s: %w", owner, img.Name, err)
	}
	return out, nil
}

// holdContent leases an image's target so that neither a GC run nor a
// concurrent delete removes it while the cache decides about it.
func (c *Cache) holdContent(ctx context.Context, img images.Image) (leases.Lease, error) {
	lm := c.client.LeasesService()
	l, err := lm.Create(ctx, leases.WithRandomID(), leases.WithExpiration(24*time.Hour),
		leases.WithLabel("warmfleet.io/hold", img.Name))
	if err != nil {
		return leases.Lease{}, fmt.Errorf("lease for %s: %w", img.Name, err)
	}
	if err := lm.AddResource(ctx, l, leases.Resource{ID: img.Target.Digest.String(), Type: "content"}); err != nil {
		_ = lm.Delete(ctx, l)
		return leases.Lease{}, fmt.Errorf("lease for %s: %w", img.Name, err)
	}
	return l, nil
}

// releaseHold drops a lease; with collect, it waits for the garbage
// collection that removes whatever the lease alone was keeping.
func (c *Cache) releaseHold(ctx context.Context, l leases.Lease, collect bool) {
	var opts []leases.DeleteOpt
	if collect {
		opts = append(opts, leases.SynchronousDelete)
	}
	// The caller's context may be canceled (a failed pull); the lease
	// must go regardless or it keeps content for a day.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := c.client.LeasesService().Delete(ctx, l, opts...); err != nil {
		c.log.Warn("could not delete lease", "lease", l.ID, "err", err)
	}
}

// releaseOld decides about the target a moved tag pointed at before: it is
// left to garbage collection when warmfleet pulled it and no container
// uses it; otherwise it stays under its digest reference (the name CRI
// gives it too), so nothing that somebody else owns disappears.
func (c *Cache) releaseOld(ctx context.Context, old images.Image, hold leases.Lease) {
	usedBy, err := c.containersUsing(ctx, old)
	if err != nil {
		c.log.Warn("cannot tell which containers use the old digest; keeping it", "ref", old.Name, "digest", old.Target.Digest, "err", err)
		usedBy = []string{"(unknown)"}
	}
	d := decideDelete(IsManaged(old.Labels), nil, usedBy)
	if !d.Delete {
		keep := images.Image{Labels: withoutOwners(old.Labels), Target: old.Target}
		keep.Name, err = digestName(old.Name, old.Target.Digest.String())
		if err == nil {
			_, err = c.client.ImageService().Create(ctx, keep)
		}
		if err != nil && !errdefs.IsAlreadyExists(err) {
			c.log.Warn("could not keep the old digest of a moved tag", "ref", old.Name, "digest", old.Target.Digest, "err", err)
		}
		c.log.Info("tag moved; old digest "+d.Reason, "ref", old.Name, "old_digest", old.Target.Digest, "kept_as", keep.Name)
		c.releaseHold(ctx, hold, false)
		return
	}
	c.releaseHold(ctx, hold, true)
	c.metrics.removals.Inc()
	c.log.Info("tag moved; old digest released", "ref", old.Name, "old_digest", old.Target.Digest)
}

// Released reports what Release did.
type Released struct {
	// Removed is true when the image was deleted from containerd.
	Removed bool
	// Reason explains the decision ("kept: still owned by ...").
	Reason string
}

// Release drops owner's claim on ref. When no owner is left, the image is
// deleted from containerd — only if warmfleet pulled it and no container
// in the namespace uses it; otherwise it stays and Reason says why.
// Releasing an image that is not there, or an owner that holds no claim,
// is not an error.
func (c *Cache) Release(ctx context.Context, ref, owner string) (Released, error) {
	if err := ValidateOwner(owner); err != nil {
		return Released{}, err
	}
	name, err := NormalizeRef(ref)
	if err != nil {
		return Released{}, err
	}
	unlock := c.locks.lock(name)
	defer unlock()
	c.dropFailureOwner(name, owner)
	ctx = c.scope(ctx)
	is := c.client.ImageService()
	img, err := is.Get(ctx, name)
	if errdefs.IsNotFound(err) {
		return Released{Reason: "not present"}, nil
	}
	if err != nil {
		return Released{}, fmt.Errorf("image %s: %w", name, err)
	}
	key := OwnerLabel(owner)
	if _, ok := img.Labels[key]; ok {
		// Updating a label path with the label absent deletes it.
		img, err = is.Update(ctx, images.Image{Name: name}, "labels."+key)
		if err != nil {
			return Released{}, fmt.Errorf("drop owner %s from %s: %w", owner, name, err)
		}
	}
	return c.removeIfUnowned(ctx, img)
}

// removeIfUnowned applies decideDelete to one image record.
func (c *Cache) removeIfUnowned(ctx context.Context, img images.Image) (Released, error) {
	owners := Owners(img.Labels)
	var usedBy []string
	if IsManaged(img.Labels) && len(owners) == 0 {
		var err error
		if usedBy, err = c.containersUsing(ctx, img); err != nil {
			return Released{}, fmt.Errorf("image %s: list containers: %w", img.Name, err)
		}
	}
	d := decideDelete(IsManaged(img.Labels), owners, usedBy)
	if !d.Delete {
		c.log.Info("image "+d.Reason, "ref", img.Name)
		return Released{Reason: d.Reason}, nil
	}
	if err := c.client.ImageService().Delete(ctx, img.Name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
		return Released{}, fmt.Errorf("delete image %s: %w", img.Name, err)
	}
	c.metrics.removals.Inc()
	c.log.Info("image "+d.Reason, "ref", img.Name, "digest", img.Target.Digest)
	return Released{Removed: true, Reason: d.Reason}, nil
}

// Sweep removes every managed image that has no owner and no container
// using it: old digests kept while a container still used them, and
// images whose owners were released while a container held them.
func (c *Cache) Sweep(ctx context.Context) ([]string, error) {
	ctx = c.scope(ctx)
	all, err := c.client.ImageService().List(ctx, `labels."`+LabelManaged+`"==true`)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var removed []string
	var errs []error
	for _, img := range all {
		if len(Owners(img.Labels)) > 0 {
			continue
		}
		r, err := func() (Released, error) {
			unlock := c.locks.lock(img.Name)
			defer unlock()
			// Re-read under the lock: an Ensure may have claimed it.
			cur, err := c.client.ImageService().Get(ctx, img.Name)
			if errdefs.IsNotFound(err) {
				return Released{}, nil
			} else if err != nil {
				return Released{}, err
			}
			return c.removeIfUnowned(ctx, cur)
		}()
		if err != nil {
			errs = append(errs, err)
		} else if r.Removed {
			removed = append(removed, img.Name)
		}
	}
	return removed, errors.Join(errs...)
}

// containersUsing lists the containers in the namespace that use img.
func (c *Cache) containersUsing(ctx context.Context, img images.Image) ([]string, error) {
	cs, err := c.client.ContainerService().List(ctx)
	if err != nil {
		return nil, err
	}
	list := make([]containerImage, 0, len(cs))
	targetOf := map[string]string{}
	for _, ct := range cs {
		list = append(list, containerImage{ID: ct.ID, Image: ct.Image})
		if ct.Image == "" || ct.Image == img.Name {
			continue
		}
		if _, seen := targetOf[ct.Image]; seen {
			continue
		}
		targetOf[ct.Image] = ""
		if other, err := c.client.ImageService().Get(ctx, ct.Image); err == nil {
			targetOf[ct.Image] = other.Target.Digest.String()
		}
	}
	configDigest := ""
	if cfg, err := images.Config(ctx, c.client.ContentStore(), img.Target, c.platform); err == nil {
		configDigest = cfg.Digest.String()
	}
	return containersUsing(img.Name, img.Target.Digest.String(), configDigest, list, targetOf), nil
}

// List returns every image the cache tracks (managed, or with owners),
// pulls in progress and failed pulls, sorted by reference.
func (c *Cache) List(ctx context.Context) ([]Status, error) {
	ctx = c.scope(ctx)
	all, err := c.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	byRef := map[string]Status{}
	for _, img := range all {
		if tracked(img.Labels) {
			byRef[img.Name] = c.status(ctx, img)
		}
	}
	c.mu.Lock()
	for name, f := range c.failures {
		st := byRef[name]
		if st.Ref == "" {
			st = Status{Ref: name, Owners: sortedKeys(f.owners)}
		}
		st.State, st.Error, st.Since = StateFailed, f.err, f.since
		byRef[name] = st
	}
	for name, p := range c.pulls {
		st := byRef[name]
		if st.Ref == "" {
			st = Status{Ref: name, Owners: []string{p.owner}, Managed: true}
		}
		st.State, st.Error, st.Since = StatePulling, "", p.since
		st.BytesDone, st.BytesTotal = p.done.Load(), p.total.Load()
		byRef[name] = st
	}
	c.mu.Unlock()
	out := make([]Status, 0, len(byRef))
	for _, st := range byRef {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, nil
}

// status describes an image record that is present.
func (c *Cache) status(ctx context.Context, img images.Image) Status {
	st := Status{
		Ref:     img.Name,
		Digest:  img.Target.Digest.String(),
		Owners:  Owners(img.Labels),
		Managed: IsManaged(img.Labels),
		State:   StateReady,
		Since:   img.UpdatedAt,
	}
	if size, err := img.Size(ctx, c.client.ContentStore(), c.platform); err == nil {
		st.Size = size
	}
	if ok, err := client.NewImageWithPlatform(c.client, img, c.platform).IsUnpacked(ctx, c.snapshotter); err == nil {
		st.Unpacked = ok
	}
	return st
}

func (c *Cache) failed(name, owner string, err error) Status {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.failures[name]
	if f == nil {
		f = &failure{owners: map[string]bool{}}
		c.failures[name] = f
	}
	f.err, f.since = err.Error(), now
	f.owners[owner] = true
	return Status{Ref: name, Owners: sortedKeys(f.owners), State: StateFailed, Error: f.err, Since: now}
}

func (c *Cache) clearFailure(name string) {
	c.mu.Lock()
	delete(c.failures, name)
	c.mu.Unlock()
}

func (c *Cache) dropFailureOwner(name, owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.failures[name]; f != nil {
		delete(f.owners, owner)
		if len(f.owners) == 0 {
			delete(c.failures, name)
		}
	}
}

// credentials answers the registry authorizer: docker config.json first
// (an explicit entry wins), then ECR tokens for ECR hosts.
func (c *Cache) credentials(ctx context.Context, host string) (Credential, error) {
	if c.dockerCfg != "" {
		cfg, err := LoadDockerConfig(c.dockerCfg)
		if err != nil {
			return Credential{}, err
		}
		cred, found, helper, err := cfg.Lookup(host)
		if err != nil || found {
			return cred, err
		}
		_, _, isECR := ParseECRHost(host)
		if helper != "" && !(isECR && helper == "ecr-login" && c.ecr != nil) {
			return Credential{}, fmt.Errorf("credentials for %s: docker credential helper %q is not supported; put the credentials under \"auths\" in %s", host, helper, c.dockerCfg)
		}
	}
	if _, _, ok := ParseECRHost(host); ok && c.ecr != nil {
		return c.ecr.credential(ctx, host)
	}
	return Credential{}, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// refLocks serializes operations on one image name (label updates are
// read-modify-write) while different names proceed in parallel.
type refLocks struct{ names locker.Locker }

func (l *refLocks) lock(name string) (unlock func()) {
	l.names.Lock(name)
	// Unlock fails only for a name not locked, which this pairing rules out.
	return func() { _ = l.names.Unlock(name) }
}
