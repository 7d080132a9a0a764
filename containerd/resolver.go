package imagecache

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/containerd/v2/core/transfer"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// credentialFunc answers containerd's authorizer for one registry host.
type credentialFunc func(ctx context.Context, host string) (Credential, error)

// newResolver builds a docker resolver for one pull: hosts from the hosts
// directory (mirrors, plain HTTP, CAs as in /etc/containerd/certs.d), and
// credentials looked up with the pull's context.
func newResolver(ctx context.Context, hostsDir string, creds credentialFunc) remotes.Resolver {
	opts := config.HostOptions{
		Credentials: func(host string) (string, string, error) {
			c, err := creds(ctx, host)
			if err != nil {
				return "", "", err
			}
			return c.Username, c.Secret, nil
		},
	}
	if hostsDir != "" {
		opts.HostDir = config.HostDirFromRoot(hostsDir)
	}
	return docker.NewResolver(docker.ResolverOptions{Hosts: config.ConfigureHosts(ctx, opts)})
}

// progress counts one pull's bytes. total is known once the manifest is
// read (config plus layers); done counts what came over the network, so a
// layer already in the content store is never fetched and never counted.
type progress struct {
	done  atomic.Int64
	total atomic.Int64
}

// countingResolver wraps a resolver so that every blob fetched is counted
// in p and in the bytes metric.
type countingResolver struct {
	remotes.Resolver
	p     *progress
	count func(int64)
}

func (r countingResolver) Fetcher(ctx context.Context, ref string) (remotes.Fetcher, error) {
	f, err := r.Resolver.Fetcher(ctx, ref)
	if err != nil {
		return nil, err
	}
	return countingFetcher{f: f, r: r}, nil
}

// SetOptions passes client.Pull's concurrency settings on, so wrapping
// changes nothing about how a pull downloads.
func (r countingResolver) SetOptions(opts ...transfer.ImageResolverOption) {
	if ro, ok := r.Resolver.(remotes.ResolverWithOptions); ok {
		ro.SetOptions(opts...)
	}
}

type countingFetcher struct {
	f remotes.Fetcher
	r countingResolver
}

func (f countingFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := f.f.Fetch(ctx, desc)
	if err != nil || images.IsManifestType(desc.MediaType) || images.IsIndexType(desc.MediaType) {
		return rc, err
	}
	add := func(n int64) {
		f.r.p.done.Add(n)
		f.r.count(n)
	}
	// Keep Seek when the registry reader has it: content.Copy seeks to
	// resume a partial ingest instead of reading the prefix again.
	if s, ok := rc.(io.ReadSeekCloser); ok {
		return &countingReadSeeker{ReadSeekCloser: s, add: add}, nil
	}
	return &countingReader{ReadCloser: rc, add: add}, nil
}

type countingReader struct {
	io.ReadCloser
	add func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.add(int64(n))
	return n, err
}

type countingReadSeeker struct {
	io.ReadSeekCloser
	add func(int64)
}

func (c *countingReadSeeker) Read(p []byte) (int, error) {
	n, err := c.ReadSeekCloser.Read(p)
	c.add(int64(n))
	return n, err
}

// totalFromManifest wraps the pull's handler chain: when a manifest has
// been read, its children (config and layers) make up the pull's total.
func totalFromManifest(p *progress) func(images.Handler) images.Handler {
	return func(h images.Handler) images.Handler {
		return images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
			children, err := h.Handle(ctx, desc)
			if err == nil && images.IsManifestType(desc.MediaType) {
				var sum int64
				for _, c := range children {
					sum += c.Size
				}
				p.total.Add(sum)
			}
			return children, err
		})
	}
}

// resolveDigest asks the registry what name currently points at.
func resolveDigest(ctx context.Context, r remotes.Resolver, name string) (string, error) {
	_, desc, err := r.Resolve(ctx, name)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", name, err)
	}
	return desc.Digest.String(), nil
}
