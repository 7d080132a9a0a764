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
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
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
	// rotated credentials apply without a restart. Its credential helpers
	// ("credHelpers", "credsStore") run as docker-credential-<name> from
	// PATH, each bounded in time.
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
	// StateIncomplete is an image record whose blobs containerd does not
	// all hold (a power cut can leave one): not ready; the next Ensure
	// fetches what is missing.
	StateIncomplete State = "incomplete"
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
	// helperTimeout bounds a docker credential helper's run.
	helperTimeout time.Duration
	metrics       *metrics
	log           *slog.Logger
	now           func() time.Time

	clog *log.Entry // containerd client logs, bridged to log

	locks refLocks

	mu       sync.Mutex
	pulls    map[string]*pullState // by ref, while pulling
	failures map[string]*failure   // by ref, last failed pull not yet superseded
	// complete holds the targets (image digests) found whole in
	// containerd since this cache started: each is read once, not at
	// every List.
	complete map[string]bool
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
		client:        c,
		ns:            opts.Namespace,
		snapshotter:   opts.Snapshotter,
		platform:      platform,
		hostsDir:      opts.HostsDir,
		dockerCfg:     opts.DockerConfig,
		helperTimeout: helperTimeout,
		metrics:       m,
		log:           opts.Logger.With("component", "imagecache", "namespace", opts.Namespace),
		now:           opts.Now,
		pulls:         map[string]*pullState{},
		failures:      map[string]*failure{},
		complete:      map[string]bool{},
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
	path := strings.TrimPrefix(address, "unix://")
	if err := probeSocket(ctx, path); err != nil {
		return nil, fmt.Errorf("containerd %s: %w", address, err)
	}
	c, err := client.New(path)
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

// probeSocket connects to the socket once: the containerd client would
// retry a socket with nothing behind it for its whole dial timeout, and
// then report only that time ran out.
func probeSocket(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) {
			err = op.Err // without the path, which the caller names
		}
		return fmt.Errorf("nothing answers on the socket (%w): is containerd running? Start it, or run the daemon with --containerd off to go without image pre-pulls", err)
	}
	return conn.Close()
}

// Close closes the containerd connection if Dial opened it.
func (c *Cache) Close() error {
	if c.ownsClient {
		return c.client.Close()
	}
	return nil
}
