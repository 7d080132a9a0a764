// Package netlab builds throwaway multi-host networks on one Linux machine
// for warmfleet's integration tests and fleet benchmarks: each host is a
// network namespace with its own address, data directory and processes, and
// all hosts hang off a Linux bridge that lives in a namespace of its own.
// Links are shaped with tc token buckets on both ends of each veth, so a
// host's send and receive rates both hold. An optional S3 host runs a real
// S3 server (versitygw) and an optional registry host a real registry.
//
// Safety: nothing is routed out of the lab. Hosts have no default route and
// no link to the root namespace, the root namespace gets a blackhole route
// for the lab's subnet while the lab lives, every process runs inside a host
// namespace, and the harness's own sockets into the lab are created inside
// the namespaces (Netns.DialContext, Netns.Listen). Everything is undone by
// Close, on SIGINT/SIGTERM, and by the Sweep at the start of a later run if
// the process crashed.
//
// It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and tc.
package netlab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options describe a lab.
type Options struct {
	// Hosts is the number of ordinary hosts, named h0, h1, ...
	Hosts int
	// Link shapes every host's link, both directions; zero leaves it
	// unshaped.
	Link Rate
	// S3 adds a host "s3" running versitygw.
	S3 bool
	// S3Link shapes the S3 host's link; zero means the same as Link.
	S3Link Rate
	// MTU of every link; zero keeps the kernel's 1500. GPU clusters
	// usually run jumbo frames (9001 in an AWS VPC), which also cut the
	// per-packet cost of the emulated links on a small machine.
	MTU int
	// S3Front, if set, wraps the S3 server in a handler (such as
	// s3fault.Proxy, to make S3 throttle or reset connections) that
	// hosts reach instead of the server; target is the server's URL as the
	// handler must call it. The handler is S3Host.Front.
	S3Front func(target string) (http.Handler, error)
	// Versitygw is the versitygw binary; default: "versitygw" in PATH.
	Versitygw string
	// Registry adds a host "registry" running Debian's docker-registry.
	Registry bool
	// Dir holds the hosts' data directories and logs. Empty: a new
	// temporary directory that Close removes.
	Dir string
	// Prefix starts every name the lab creates; default "wf". Sweep only
	// touches names with the same prefix.
	Prefix string
	// SubnetBase is the range the lab's /24 is taken from; default
	// 10.213.0.0/16.
	SubnetBase netip.Prefix
	// Logger gets the lab's progress; default discards.
	Logger *slog.Logger
}

// maxHosts leaves room in a /24 for the service hosts.
const maxHosts = 200

// Addresses in the lab's /24.
const (
	s3Octet       = 2
	registryOctet = 3
	firstHost     = 10
)

// Lab is a running topology. Close it.
type Lab struct {
	log      *slog.Logger
	state    runState
	bridge   Netns
	dir      string
	ownDir   bool
	hosts    []*Host
	s3       *S3Host
	registry *Registry
	mtu      int

	mu      sync.Mutex
	procs   []*Process
	closers []func() error

	closeOnce   sync.Once
	closeErr    error
	stopSignals func()
}

// New builds a lab. On error everything built so far is torn down.
func New(ctx context.Context, opts Options) (_ *Lab, err error) {
	if opts.Hosts < 0 || opts.Hosts > maxHosts {
		return nil, fmt.Errorf("netlab: %d hosts: want 0 to %d", opts.Hosts, maxHosts)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("netlab: needs root for network namespaces, veths, tc and mounts")
	}
	if opts.Prefix == "" {
		opts.Prefix = "wf"
	}
	if strings.ContainsAny(opts.Prefix, "-/ ") || len(opts.Prefix) > 8 {
		return nil, fmt.Errorf("netlab: prefix %q: want up to 8 characters without '-', '/' or spaces", opts.Prefix)
	}
	if !opts.SubnetBase.IsValid() {
		opts.SubnetBase = defaultSubnetBase
	}
	if opts.S3Link == 0 {
		opts.S3Link = opts.Link
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := Sweep(ctx, opts.Prefix, log); err != nil {
		// A leftover we cannot remove should not stop a fresh run, which
		// picks its own names and subnet.
		log.Warn("netlab: sweep of old runs failed", "err", err)
	}
	pid := os.Getpid()
	ticks, ok := procStartTicks(pid)
	if !ok {
		return nil, errors.New("netlab: cannot read own start time from /proc")
	}
	runID := fmt.Sprintf("%s-%d-%04x", opts.Prefix, pid, rand.IntN(1<<16))
	l := &Lab{
		log:    log.With("run", runID),
		bridge: Netns(runID + "-br"),
		dir:    opts.Dir,
		mtu:    opts.MTU,
		state:  runState{RunID: runID, PID: pid, StartTicks: ticks, RunDir: filepath.Join(os.TempDir(), runID)},
	}
	if l.dir == "" {
		if l.dir, err = os.MkdirTemp("", runID+"-data-"); err != nil {
			return nil, fmt.Errorf("netlab: %w", err)
		}
		l.ownDir = true
	}
	l.watchSignals()
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	if err := os.MkdirAll(l.state.RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("netlab: %w", err)
	}
	if err := l.claimSubnet(ctx, opts.SubnetBase); err != nil {
		return nil, err
	}
	l.log.Info("netlab: subnet claimed", "subnet", l.state.Subnet)
	if err := l.addNetns(ctx, l.bridge); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"-n", string(l.bridge), "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"-n", string(l.bridge), "link", "set", "br0", "up"},
	} {
		if _, err := ip(ctx, args...); err != nil {
			return nil, fmt.Errorf("netlab: bridge: %w", err)
		}
	}
	for i := range opts.Hosts {
		h, err := l.addHost(ctx, fmt.Sprintf("h%d", i), byte(firstHost+i), opts.Link)
		if err != nil {
			return nil, err
		}
		l.hosts = append(l.hosts, h)
	}
	if opts.S3 {
		h, err := l.addHost(ctx, "s3", s3Octet, opts.S3Link)
		if err != nil {
			return nil, err
		}
		if l.s3, err = startS3Host(ctx, l, h, opts.Versitygw, opts.S3Front); err != nil {
			return nil, err
		}
	}
	if opts.Registry {
		h, err := l.addHost(ctx, "registry", registryOctet, opts.Link)
		if err != nil {
			return nil, err
		}
		if l.registry, err = startRegistry(ctx, l, h); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// claimSubnet takes the first free /24 of base. The blackhole route is the
// lock: adding it fails if a concurrent run got there first.
func (l *Lab) claimSubnet(ctx context.Context, base netip.Prefix) error {
	out, err := ip(ctx, "-4", "-j", "route", "show", "table", "all")
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	used, _, err := parseRoutes([]byte(out))
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	for _, cand := range freeSubnets(base, used, l.state.PID) {
		l.state.Subnet, l.state.Route = cand, true
		if err := l.state.save(); err != nil {
			return fmt.Errorf("netlab: %w", err)
		}
		_, err := ip(ctx, "route", "add", "blackhole", cand.String(), "proto", routeProto)
		if err == nil {
			return nil
		}
		l.state.Route = false
		if !strings.Contains(err.Error(), "File exists") {
			return fmt.Errorf("netlab: blackhole route: %w", err)
		}
	}
	l.state.Subnet = netip.Prefix{}
	return fmt.Errorf("netlab: no free /24 left in %s", base)
}

// addNetns records a namespace in the run state, then creates it.
func (l *Lab) addNetns(ctx context.Context, ns Netns) error {
	l.mu.Lock()
	l.state.Namespaces = append(l.state.Namespaces, string(ns))
	err := l.state.save()
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	if _, err := ip(ctx, "netns", "add", string(ns)); err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	return nil
}

// addHost creates a namespace with a veth into the bridge. The veth pair is
// created inside the namespaces, so it never exists in the root namespace.
func (l *Lab) addHost(ctx context.Context, name string, octet byte, rate Rate) (*Host, error) {
	ns := Netns(l.state.RunID + "-" + name)
	if err := l.addNetns(ctx, ns); err != nil {
		return nil, err
	}
	h := &Host{
		Name:    name,
		NS:      ns,
		IP:      hostAddr(l.state.Subnet, octet),
		Dir:     filepath.Join(l.dir, name),
		DataDir: filepath.Join(l.dir, name, "data"),
		lab:     l,
	}
	h.link = &Link{host: h, bridge: l.bridge, port: "p-" + name}
	if err := os.MkdirAll(h.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("netlab: host %s: %w", name, err)
	}
	prefix := netip.PrefixFrom(h.IP, l.state.Subnet.Bits()).String()
	for _, args := range [][]string{
		{"-n", string(ns), "link", "set", "lo", "up"},
		{"-n", string(l.bridge), "link", "add", h.link.port, "type", "veth", "peer", "name", "eth0", "netns", string(ns)},
		{"-n", string(l.bridge), "link", "set", h.link.port, "master", "br0"},
		{"-n", string(l.bridge), "link", "set", h.link.port, "up"},
		{"-n", string(ns), "addr", "add", prefix, "dev", "eth0"},
		{"-n", string(ns), "link", "set", "eth0", "up"},
	} {
		if _, err := ip(ctx, args...); err != nil {
			return nil, fmt.Errorf("netlab: host %s: %w", name, err)
		}
	}
	if l.mtu > 0 {
		mtu := strconv.Itoa(l.mtu)
		for _, args := range [][]string{
			{"-n", string(l.bridge), "link", "set", h.link.port, "mtu", mtu},
			{"-n", string(l.bridge), "link", "set", "br0", "mtu", mtu},
			{"-n", string(ns), "link", "set", "eth0", "mtu", mtu},
		} {
			if _, err := ip(ctx, args...); err != nil {
				return nil, fmt.Errorf("netlab: host %s: %w", name, err)
			}
		}
	}
	if err := h.link.Shape(ctx, rate); err != nil {
		return nil, fmt.Errorf("netlab: host %s: %w", name, err)
	}
	l.log.Info("netlab: host up", "host", name, "ip", h.IP, "netns", ns, "link", rate)
	return h, nil
}

// RunID is the unique prefix of every name this lab created.
func (l *Lab) RunID() string { return l.state.RunID }

// Subnet is the lab's /24.
func (l *Lab) Subnet() netip.Prefix { return l.state.Subnet }

// Namespaces lists the lab's network namespaces, bridge included.
func (l *Lab) Namespaces() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.state.Namespaces...)
}

// Bridge is the namespace holding the bridge.
func (l *Lab) Bridge() Netns { return l.bridge }

// Hosts are the ordinary hosts, h0 first.
func (l *Lab) Hosts() []*Host { return l.hosts }

// Host returns the host named name (h0, s3, registry), or nil.
func (l *Lab) Host(name string) *Host {
	for _, h := range l.hosts {
		if h.Name == name {
			return h
		}
	}
	if l.s3 != nil && l.s3.Name == name {
		return l.s3.Host
	}
	if l.registry != nil && l.registry.Name == name {
		return l.registry.Host
	}
	return nil
}

// S3 is the S3 host, or nil without Options.S3.
func (l *Lab) S3() *S3Host { return l.s3 }

// Registry is the registry host, or nil without Options.Registry.
func (l *Lab) Registry() *Registry { return l.registry }

// Dir is where hosts keep their data directories and logs.
func (l *Lab) Dir() string { return l.dir }

// RunDir is a short per-run directory for unix sockets (their paths are
// limited to 107 bytes); Close removes it.
func (l *Lab) RunDir() string { return l.state.RunDir }

func (l *Lab) track(p *Process) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.procs = append(l.procs, p)
}

// onClose registers f to run at Close before the namespaces go.
func (l *Lab) onClose(f func() error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closers = append(l.closers, f)
}

func (l *Lab) addMount(path string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state.Mounts = append(l.state.Mounts, path)
	return l.state.save()
}

// Close stops every process, unmounts, deletes the namespaces (and with them
// the veths and the bridge), removes the blackhole route and the run's
// files. It is safe to call more than once and from several goroutines.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		l.stopSignals()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l.mu.Lock()
		procs, closers := l.procs, l.closers
		l.mu.Unlock()
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		for _, p := range procs {
			if err := p.Stop(5 * time.Second); err != nil && !errors.Is(err, errNotRunning) {
				errs = append(errs, err)
			}
		}
		l.mu.Lock()
		st := l.state
		l.mu.Unlock()
		errs = append(errs, teardown(ctx, &st, l.log))
		if l.ownDir {
			errs = append(errs, os.RemoveAll(l.dir))
		}
		l.closeErr = errors.Join(errs...)
		l.log.Info("netlab: closed", "err", l.closeErr)
	})
	return l.closeErr
}

// watchSignals cleans up on SIGINT/SIGTERM and then lets the signal take
// its usual course (re-raised once nobody else listens for it).
func (l *Lab) watchSignals() {
	sigc := make(chan os.Signal, 1)
	done := make(chan struct{})
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	var once sync.Once
	l.stopSignals = func() {
		once.Do(func() {
			signal.Stop(sigc)
			close(done)
		})
	}
	go func() {
		select {
		case sig := <-sigc:
			l.log.Warn("netlab: signal received, tearing the lab down", "signal", sig)
			_ = l.Close()
			if s, ok := sig.(syscall.Signal); ok {
				_ = syscall.Kill(os.Getpid(), s)
			}
		case <-done:
		}
	}()
}
