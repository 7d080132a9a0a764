package imagecache

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
)

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
	if reason := c.incomplete(ctx, img); reason != "" {
		st.State, st.Error = StateIncomplete, reason
	}
	if size, err := img.Size(ctx, c.client.ContentStore(), c.platform); err == nil {
		st.Size = size
	}
	if ok, err := client.NewImageWithPlatform(c.client, img, c.platform).IsUnpacked(ctx, c.snapshotter); err == nil {
		st.Unpacked = ok
	}
	return st
}

// incomplete says what containerd lacks of img ("" when it holds every
// blob): a record alone does not make an image ready, since a power cut
// can keep an image's record and lose blobs written before it (see
// missingBlobs). A target found whole is not read again.
func (c *Cache) incomplete(ctx context.Context, img images.Image) string {
	key := img.Target.Digest.String()
	c.mu.Lock()
	done := c.complete[key]
	c.mu.Unlock()
	if done {
		return ""
	}
	missing, err := c.missingBlobs(ctx, img.Target, false)
	switch {
	case err != nil:
		return fmt.Sprintf("check the image's content: %v", err)
	case len(missing) > 0:
		return fmt.Sprintf("containerd lacks %d of its blobs (%s); the next pull fetches them", len(missing), missing[0])
	}
	c.mu.Lock()
	c.complete[key] = true
	c.mu.Unlock()
	return ""
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

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
