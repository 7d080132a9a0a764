package imagecache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/moby/locker"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

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
			// Unpacked, but a power cut can have taken blobs whose records
			// stayed: the pull fetches them again.
			missing, err := c.missingBlobs(ctx, existing.Target, false)
			if err != nil || len(missing) > 0 {
				c.log.Warn("image incomplete in containerd; pulling again", "ref", name, "missing", missing, "err", err)
				unpacked = false
			}
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
	opts := []client.RemoteOpt{
		client.WithPullUnpack,
		client.WithPullSnapshotter(c.snapshotter),
		client.WithPlatformMatcher(c.platform),
		client.WithResolver(countingResolver{Resolver: resolver, p: &ps.progress, count: func(n int64) { c.metrics.bytes.Add(float64(n)) }}),
		client.WithImageHandlerWrapper(totalFromManifest(&ps.progress)),
		client.WithPullLabels(labels),
	}
	img, err := c.pullWhole(ctx, name, resolver, opts)
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

// pullWhole pulls name and makes sure containerd then holds every blob
// of it, not only a record of each: a pull skips the fetch of a blob it
// finds recorded, and of a layer already unpacked, so records whose blobs
// a power cut took (missingBlobs) make it fail, or succeed with blobs
// missing. Each such round drops the records, fetches what is missing and
// pulls again.
func (c *Cache) pullWhole(ctx context.Context, name string, resolver remotes.Resolver, opts []client.RemoteOpt) (client.Image, error) {
	for round := 0; ; round++ {
		img, err := c.client.Pull(ctx, name, opts...)
		if round == maxDanglingRounds || ctx.Err() != nil || err != nil && !errdefs.IsNotFound(err) {
			return img, err
		}
		var target ocispec.Descriptor
		if err == nil {
			target = img.Target()
		} else if _, target, err = resolver.Resolve(ctx, name); err != nil {
			return nil, err
		}
		missing, merr := c.missingBlobs(ctx, target, true)
		if merr != nil {
			return nil, errors.Join(err, fmt.Errorf("check the content of %s: %w", name, merr))
		}
		if len(missing) == 0 {
			return img, err
		}
		c.log.Warn("blobs missing behind the pull (a power cut can leave records without them); fetching them", "ref", name, "digests", missing, "pull_err", err)
		// The unpacker fetches no layer already unpacked: fetch what is
		// missing first.
		fetcher, ferr := resolver.Fetcher(ctx, name)
		if ferr == nil {
			cs := c.client.ContentStore()
			ferr = images.Dispatch(ctx, images.Handlers(remotes.FetchHandler(cs, fetcher),
				images.FilterPlatforms(images.ChildrenHandler(cs), c.platform)), nil, target)
		}
		if ferr != nil {
			return nil, fmt.Errorf("fetch %s again: %w", name, ferr)
		}
	}
}

// maxDanglingRounds bounds the pulls again after fetching missing blobs:
// one per level of an image's tree, with room.
const maxDanglingRounds = 4

// missingBlobs returns the digests of the blobs of the image tree at
// target (for this platform) that containerd's content store cannot read:
// never fetched, or recorded without their file; with drop, it deletes
// the records of the latter. A power cut leaves such records: containerd
// fsyncs a committed blob and its metadata DB, not the directory the blob
// is renamed into, so the rename can be lost while the record stays, and
// a pull skips the fetch of a blob it finds recorded. Only metadata goes:
// containerd's garbage collector owns files.
func (c *Cache) missingBlobs(ctx context.Context, target ocispec.Descriptor, drop bool) ([]digest.Digest, error) {
	cs := c.client.ContentStore()
	var missing []digest.Digest
	check := images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		err := readable(ctx, cs, desc)
		if err == nil {
			return nil, nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, err
		}
		if drop {
			if err := cs.Delete(ctx, desc.Digest); err != nil && !errdefs.IsNotFound(err) {
				return nil, fmt.Errorf("drop the record of %s: %w", desc.Digest, err)
			}
		}
		missing = append(missing, desc.Digest)
		return nil, images.ErrSkipDesc
	})
	walk := images.Handlers(check, images.FilterPlatforms(images.ChildrenHandler(cs), c.platform))
	if err := images.Walk(ctx, walk, target); err != nil {
		return missing, err
	}
	return missing, nil
}

// readable reads desc's first byte: a reader of the client's content
// store opens the blob only at its first read.
func readable(ctx context.Context, cs content.Store, desc ocispec.Descriptor) error {
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return err
	}
	defer ra.Close()
	if desc.Size == 0 {
		return nil
	}
	_, err = ra.ReadAt(make([]byte, 1), 0)
	return err
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

// credentials answers the registry authorizer as the docker CLI would
// from config.json: the host's credential helper ("credHelpers", else
// "credsStore") when one is set, else its "auths" entry; then, for an ECR
// host nothing answered for, a token from ECR. The "ecr-login" helper is
// served by the built-in ECR client, which needs no helper executable.
func (c *Cache) credentials(ctx context.Context, host string) (Credential, error) {
	_, _, isECR := ParseECRHost(host)
	if c.dockerCfg != "" {
		cfg, err := LoadDockerConfig(c.dockerCfg)
		if err != nil {
			return Credential{}, fmt.Errorf("credentials for %s: %w", host, err)
		}
		switch helper := cfg.Helper(host); {
		case helper == "ecr-login" && isECR && c.ecr != nil:
			return c.ecr.credential(ctx, host)
		case helper != "":
			cred, found, err := runCredentialHelper(ctx, helper, host, c.helperTimeout)
			if err != nil {
				return Credential{}, fmt.Errorf("credentials for %s (docker config %s): %w", host, c.dockerCfg, err)
			}
			if found {
				return cred, nil
			}
		default:
			if cred, found := cfg.Entry(host); found {
				return cred, nil
			}
		}
	}
	if isECR && c.ecr != nil {
		return c.ecr.credential(ctx, host)
	}
	return Credential{}, nil
}

// refLocks serializes operations on one image name (label updates are
// read-modify-write) while different names proceed in parallel.
type refLocks struct{ names locker.Locker }

func (l *refLocks) lock(name string) (unlock func()) {
	l.names.Lock(name)
	// Unlock fails only for a name not locked, which this pairing rules out.
	return func() { _ = l.names.Unlock(name) }
}
