package imagecache

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
)

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
