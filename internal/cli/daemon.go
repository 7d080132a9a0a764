package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	imagecache "github.com/warmfleet/warmfleet/containerd"
	"github.com/warmfleet/warmfleet/daemon"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/health"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/sdnotify"
	"github.com/warmfleet/warmfleet/nvme"
	"github.com/warmfleet/warmfleet/p2p"
	"github.com/warmfleet/warmfleet/spec"
)

// defaultAPI is where the daemon listens and clients look by default.
const defaultAPI = "unix:///run/warmfleet/api.sock"

// daemonFlags are the daemon's settings, from flags, env and --config.
type daemonFlags struct {
	nodeName        string
	dataDir         string
	apiAddr         string
	apiTokenFile    string
	metricsListen   string
	labels          listFlag
	reserve         byteSize
	reserveFraction float64
	partSize        byteSize
	s3Concurrency   int
	hfEndpoint      string
	hfTokenFile     string
	torrent         torrentFlags
	fileConcurrency int
	resync          time.Duration
	oldGrace        time.Duration
	logLevel        string
	logFormat       string
	gossipAddr      string
	advertise       string
	join            listFlag
	clusterKeyFile  string
	insecureGossip  bool
	zone            string
	p2pAddr         string
	p2pAdvertise    string
	p2pUpload       byteSize
	p2pDownload     byteSize
	p2pMaxUploads   int
	p2pEncrypt      bool
	containerd      string
	containerdNS    string
	registryHosts   string
	registryAuth    string
	kubernetes      autoFlag
	nodeEvents      bool
	discover        listFlag
	discoverEvery   time.Duration
	// kubeNode is NODE_NAME from the environment: the Node to label.
	kubeNode string
	// clock is Env.Clock: nil but in the lab.
	clock func() time.Time
	// kubeConnect reaches the Kubernetes API; nil means in-cluster (kube.CoreV1).
	kubeConnect kubeConnector
	// labelPoll is how often the node labels read the caches; 0 means nodeLabelPoll.
	labelPoll     time.Duration
	apply         applyDirFlags
	discoverPods  bool
	podsNamespace string
	// podsConnect reaches the Pod API; nil means in-cluster (kube.CoreV1).
	podsConnect podsConnector
}

func (f *daemonFlags) register(fs *flagSet) {
	host, _ := os.Hostname()
	fs.StringVar(&f.nodeName, "node-name", host, "this node's name in the fleet")
	fs.StringVar(&f.dataDir, "data-dir", defaultDataDir(mountInfoPath), "cache directory on the node's NVMe (default "+dlamiNVMe+"/warmfleet when "+dlamiNVMe+" is a mount point, as on HyperPod and the Deep Learning AMI, else "+fallbackDataDir+")")
	fs.StringVar(&f.apiAddr, "api", defaultAPI, "API address: unix:///path.sock or host:port")
	fs.StringVar(&f.apiTokenFile, "api-token-file", "", "file holding the bearer token the API requires (needed for a non-loopback TCP address)")
	fs.StringVar(&f.metricsListen, "metrics-listen", "", "read-only listener for /metrics, /healthz, /readyz and the /ui status page without a token, e.g. :9464 (empty: off; the API serves them too)")
	fs.Var(&f.labels, "label", "node label k=v (repeatable)")
	f.reserve = nvme.DefaultReserveBytes
	fs.Var(&f.reserve, "reserve", "space left free on the data dir's file system, e.g. 10GiB")
	fs.Float64Var(&f.reserveFraction, "reserve-fraction", nvme.DefaultReserveFraction, "fraction of the file system left free (the larger reserve applies)")
	f.partSize = s3origin.DefaultPartSize
	fs.Var(&f.partSize, "part-size", "S3 ranged-GET part size, the unit of resume (1MiB..1GiB)")
	fs.IntVar(&f.s3Concurrency, "s3-concurrency", s3origin.DefaultConcurrency, "parallel ranged GETs per file")
	fs.StringVar(&f.hfEndpoint, "hf-endpoint", "", "Hugging Face Hub (or mirror) for hf:// sources (default $HF_ENDPOINT, else https://huggingface.co)")
	fs.StringVar(&f.hfTokenFile, "hf-token-file", "", "file holding the Hub token for gated repositories (default $HF_TOKEN, else $HF_TOKEN_PATH, else $HF_HOME/token)")
	f.torrent.register(fs)
	fs.IntVar(&f.fileConcurrency, "file-concurrency", 2, "files of one model downloaded at once")
	fs.DurationVar(&f.resync, "resync-interval", 10*time.Minute, "how often a ready cache re-lists its source to notice changes (0 = never)")
	fs.DurationVar(&f.oldGrace, "old-revision-grace", 10*time.Minute, "how long a model's previous revision stays on disk after an update, for inference servers still loading it (0 = delete at once; deleted sooner when a download needs the space)")
	fs.StringVar(&f.gossipAddr, "gossip", "", "gossip bind address ip:port; empty runs the node alone")
	fs.StringVar(&f.advertise, "advertise", "", "gossip address other members should use, if not --gossip")
	fs.Var(&f.join, "join", "members to join, host:port (repeatable or comma-separated)")
	fs.StringVar(&f.clusterKeyFile, "cluster-key-file", "", "file with the cluster key(s), base64 of 32 bytes (warmfleet keygen)")
	fs.BoolVar(&f.insecureGossip, "insecure-gossip", false, "DEV ONLY: gossip without encryption or authentication")
	fs.StringVar(&f.zone, "zone", "", "this node's zone, shown to the fleet")
	fs.StringVar(&f.p2pAddr, "p2p", "", "peer-to-peer listener ip:port: model files swarm between fleet members (needs --gossip and --cluster-key-file)")
	fs.StringVar(&f.p2pAdvertise, "p2p-advertise", "", "peer address other members should use, if not --p2p")
	fs.Var(&f.p2pUpload, "p2p-upload-limit", "bytes per second served to peers, e.g. 500MiB; each upload is paced by the kernel at its share, so set it a little under the link rate and uploads reach peers without line-rate bursts (0 = unlimited)")
	fs.Var(&f.p2pDownload, "p2p-download-limit", "bytes per second taken from peers, e.g. 1GiB (0 = unlimited; S3 reads are not counted)")
	fs.BoolVar(&f.p2pEncrypt, "p2p-encrypt", true, "encrypt peer connections with TLS 1.3 (the authenticated handshake runs inside it); every member must agree. --p2p-encrypt=false trades confidentiality for sendfile: pieces go in the clear and whoever is on the path can read them or take over a connection (handshakes are still authenticated and pieces still checked against their hashes)")
	fs.IntVar(&f.p2pMaxUploads, "p2p-max-uploads", 8, "pieces served to peers at once; more requests are told to ask elsewhere, so local readers keep their share")
	fs.StringVar(&f.containerd, "containerd", "", "containerd socket for image pre-pulls: unix:///run/containerd/containerd.sock, or off (default: that socket if it exists)")
	fs.StringVar(&f.containerdNS, "containerd-namespace", "k8s.io", "containerd namespace images are pulled into (kubelet's)")
	fs.StringVar(&f.registryHosts, "registry-hosts-dir", "", "hosts.toml directory for registry mirrors and plain HTTP, e.g. /etc/containerd/certs.d")
	fs.StringVar(&f.registryAuth, "registry-auth-file", "", "docker config.json with registry credentials (default ~/.docker/config.json)")
	// --kubernetes alone means true.
	fs.VarPF(&f.kubernetes, "kubernetes", "", "label this node's Kubernetes Node (NODE_NAME, else --node-name) with the caches ready on it: auto (in a pod), true or false").NoOptDefVal = "true"
	fs.BoolVar(&f.nodeEvents, "node-events", false, "with node labels, also record Events on the Node when a cache or image becomes ready or fails (needs create on events in the default namespace)")
	fs.Var(&f.discover, "discover-endpoints", "base URLs of local OpenAI-compatible servers, e.g. http://127.0.0.1:8000 (repeatable or comma-separated): each is asked for /v1/models and registered as an endpoint for a model it serves, and removed when it stops answering")
	fs.DurationVar(&f.discoverEvery, "discover-interval", 10*time.Second, "how often --discover-endpoints servers are asked (and --discover-pods servers without a warmfleet.io/model annotation)")
	fs.BoolVar(&f.discoverPods, "discover-pods", false, "register the ready pods of this Kubernetes Node (NODE_NAME, else --node-name) annotated warmfleet.io/endpoint-port as endpoints, for their warmfleet.io/model annotation or a model they list at /v1/models; removed when a pod goes unready or away (needs list and watch on pods)")
	fs.StringVar(&f.podsNamespace, "discover-pods-namespace", "", "namespace whose pods --discover-pods watches (empty: all namespaces, which needs a ClusterRole)")
	f.apply.register(fs)
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json")
}

func daemonCommand(e *Env) *cobra.Command {
	var d *daemonCommandFlags
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "run the node daemon (cache, gossip, swarm, image cache, API)",
		Long: `Run the node daemon: it keeps the fleet's caches on this node's NVMe (from S3,
the Hugging Face Hub, BitTorrent or peers), pre-pulls container images into containerd,
gossips with the fleet and serves the local API the client commands use. S3
settings come from the AWS SDK's standard chain: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL_S3 (for a server other
than AWS), AWS_PROFILE or the instance's role; Hub settings from
--hf-endpoint and --hf-token-file (or HF_ENDPOINT, HF_TOKEN); BitTorrent
settings from the --torrent-* flags: DHT, trackers, PEX, web seeds and
uploading to the public swarm are off unless turned on.

Every flag may also come from WARMFLEET_<FLAG> (e.g. WARMFLEET_DATA_DIR) or
from the --config file (flag names as keys).`,
		Example: `  warmfleet daemon --data-dir /var/lib/warmfleet --label gpu=h100
  warmfleet daemon --config /etc/warmfleet/daemon.yaml
  warmfleet daemon --gossip 10.0.0.5:7946 --join 10.0.0.6:7946 --cluster-key-file /etc/warmfleet/cluster.key --p2p 10.0.0.5:7947`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return d.serve(cmd.Context(), e, cmd.Flags(), s3origin.Options{}, nil, nil)
		},
	}
	d = registerDaemon(cmd.Flags())
	return cmd
}

// daemonCommandFlags are the daemon's flags and --config.
type daemonCommandFlags struct {
	f          daemonFlags
	configPath string
}

func registerDaemon(fs *flagSet) *daemonCommandFlags {
	d := &daemonCommandFlags{}
	d.f.register(fs)
	fs.StringVar(&d.configPath, "config", "", "YAML file of flag names to values")
	return d
}

// ServeDaemon runs `warmfleet daemon args...` until ctx ends; origin holds S3
// settings beyond the SDK's standard chain (the lab's embedded server) and
// started, if not nil, is called once the API listens.
func ServeDaemon(ctx context.Context, e *Env, args []string, origin s3origin.Options, started func()) error {
	return serveDaemonArgs(ctx, e, args, origin, started, nil)
}

// serveDaemonArgs is ServeDaemon with mod, if not nil, applied to the
// parsed flags: tests set what no flag reaches (the Kubernetes client).
func serveDaemonArgs(ctx context.Context, e *Env, args []string, origin s3origin.Options, started func(), mod func(*daemonFlags)) error {
	fs := newFlagSet(e, "daemon")
	d := registerDaemon(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	return d.serve(ctx, e, fs, origin, started, mod)
}

// serve fills the flags not given from the environment and --config,
// checks them, applies mod (if not nil) and runs the daemon.
func (d *daemonCommandFlags) serve(ctx context.Context, e *Env, fs *flagSet, origin s3origin.Options, started func(), mod func(*daemonFlags)) error {
	if err := parseWithConfig(fs, e, &d.configPath); err != nil {
		return err
	}
	f := &d.f
	log, err := newLogger(e, f.logLevel, f.logFormat)
	if err != nil {
		return err
	}
	labels, err := spec.ParseLabels(f.labels)
	if err != nil {
		return usageError("%v", err)
	}
	addr, err := api.ParseAddr(f.apiAddr)
	if err != nil {
		return usageError("%v", err)
	}
	token, err := readToken(f.apiTokenFile)
	if err != nil {
		return err
	}
	if addr.Network == "tcp" && token == "" && !addr.Loopback() {
		return usageError("api %s is reachable from other hosts: give a bearer token (--api-token-file)", addr)
	}
	if f.s3Concurrency < 1 || f.fileConcurrency < 1 {
		return usageError("--s3-concurrency and --file-concurrency must be >= 1")
	}
	discover, err := parseDiscoverURLs(f.discover)
	if err != nil {
		return usageError("%v", err)
	}
	f.discover = discover
	if err := f.apply.check(); err != nil {
		return err
	}
	if (len(discover) > 0 || f.discoverPods) && f.discoverEvery <= 0 {
		return usageError("--discover-interval %v: want > 0", f.discoverEvery)
	}
	if f.oldGrace < 0 {
		return usageError("--old-revision-grace %v: want a duration >= 0 (0 deletes old revisions at once)", f.oldGrace)
	}

	f.kubeNode = e.Getenv("NODE_NAME")
	f.clock = e.Clock
	if mod != nil {
		mod(f)
	}
	hf, err := hubOptions(f, e.Getenv)
	if err != nil {
		return err
	}
	return serveDaemon(ctx, log, f, labels, addr, token, origins{s3: origin, hf: hf}, started)
}

// The daemon's shutdown stages, in order (parts.Wait).
const (
	// stageListeners stops the API, the metrics listener and the watchdog:
	// no new requests, and systemd hears the daemon is stopping.
	stageListeners = iota
	// stageReconciler stops the reconcile loop and its fetches (progress
	// is kept), which use the fleet, the swarm and the image cache.
	stageReconciler
	// stageGossip leaves the fleet, so the others stop sending work here.
	stageGossip
	// stageSwarm closes the peer listener and waits for the uploads.
	stageSwarm
)

// leaveTimeout bounds the goodbye to the fleet: when the whole fleet stops
// at once nobody is left to acknowledge it, and the others notice a node
// that left without one by their failure detector anyway.
const leaveTimeout = time.Second

// serveDaemon is the daemon's composition root: it builds every part in the
// order their dependencies need (metrics listener, S3 origin, the base with
// the state, desired state and registry, gossip and the swarm on the base,
// the image cache, the daemon on all of them, the API listener), runs the
// long-running ones as parts and, when ctx ends or a part fails, stops them
// in this order: the API and metrics listeners and the watchdog; the
// reconciler; gossip (leave the fleet); the swarm; then the image cache is
// closed and, last, the state. The first part to fail is the error
// returned. opts holds the origins' settings (for S3, those beyond the
// SDK's standard chain: the demo's embedded server; the Hub's endpoint and
// token); started, if not nil, is called once the API listens.
func serveDaemon(ctx context.Context, log *slog.Logger, f *daemonFlags, labels map[string]string, addr api.Addr, token string, opts origins, started func()) (err error) {
	ps := newParts(ctx)
	// The swarm authenticates peers with the gossip keyring once gossip
	// runs, so a fleet-wide key rotation reaches it too.
	var fleetNode atomic.Pointer[gossip.Node]
	probes := newDaemonProbes(f.join, &fleetNode)
	if err := startMetrics(ps, log, f.metricsListen, probes.handler()); err != nil {
		return ps.fail(err)
	}
	var d *daemon.Daemon
	mux, closeOrigins, err := opts.build(ps.ctx, log, f, func(kind string, n int) { d.AddOriginBytes(kind, n) })
	if err != nil {
		return ps.fail(err)
	}
	// After every part stopped: the fetches read through the origins.
	defer func() {
		if cerr := closeOrigins(); cerr != nil {
			log.Warn("close origins", "err", cerr)
		}
	}()
	base, err := daemon.Open(daemon.Config{
		NodeName: f.nodeName, DataDir: f.dataDir, Labels: labels, PartSize: int64(f.partSize),
		FileConcurrency: f.fileConcurrency, ReserveBytes: int64(f.reserve), ReserveFraction: f.reserveFraction,
		ResyncInterval: f.resync, OldRevisionGrace: f.oldGrace, Version: Version(), Logger: log, Clock: f.clock,
	})
	if err != nil {
		return ps.fail(err)
	}
	running := false
	defer func() {
		if running {
			log.Info("warmfleet daemon stopped")
		}
	}()
	// The state closes last (deferred first): after every part stopped and
	// after the image cache.
	closeState := base.Close
	defer func() {
		if cerr := closeState(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()

	var deps daemon.Deps
	var peerAddr string
	var peerKey []byte
	if f.p2pAddr != "" {
		ln, node, err := startSwarm(ps.ctx, log, f, func() swarmFleet {
			if g := fleetNode.Load(); g != nil {
				return g
			}
			return nil
		})
		if err != nil {
			return ps.fail(err)
		}
		deps.Swarm = node
		peerAddr, peerKey = peerAdvertise(f, ln.Addr()), node.PublicKey()
		ps.start(stageSwarm, "p2p listener", func(ctx context.Context) error { return node.Serve(ctx, ln) }, nil)
	}
	if f.gossipAddr != "" {
		node, err := startGossip(ps.ctx, log, f, labels, addr, base, peerAddr, peerKey)
		if err != nil {
			return ps.fail(err)
		}
		ps.start(stageGossip, "gossip", leaveAtStop(log, node), nil)
		deps.Fleet = node
		fleetNode.Store(node)
	}
	images, err := dialContainerd(ps.ctx, log, f, base)
	if err != nil {
		return ps.fail(err)
	}
	if images != nil {
		defer images.Close()
		deps.Images = images
	}
	if d, err = daemon.New(base, mux, deps); err != nil {
		return ps.fail(err)
	}
	closeState = d.Close
	probes.daemon.Store(d)

	ln, err := daemon.Listen(ps.ctx, addr, token)
	if err != nil {
		return ps.fail(err)
	}
	ps.start(stageReconciler, "reconciler", d.Run, nil)
	if err := startNodeLabels(ps, log, f, d, deps.Images != nil, base.Registry()); err != nil {
		return ps.fail(err)
	}
	if err := startPodDiscovery(ps, log, f, d, base.Registry()); err != nil {
		return ps.fail(err)
	}
	if len(f.discover) > 0 {
		ps.start(stageListeners, "endpoint discovery", discoverEndpoints(log.With("component", "discovery"), d, f.discover, f.discoverEvery), nil)
	}
	if err := f.apply.start(ps, d); err != nil {
		return ps.fail(err)
	}
	srv := apiServer(d.APIHandler(token, probes.ready.Err))
	ps.start(stageListeners, "api server", serveHTTP(srv, ln), func() {
		probes.serving.Store(false)
		// A client still mid-request is no reason to fail the stop.
		shutdownHTTP(srv, 5*time.Second, func(err error) {
			log.Warn("api connections still open at shutdown: closing them", "err", err)
		})()
	})
	probes.serving.Store(true)
	// The watchdog is fed while the state reads: a daemon wedged on its
	// store is restarted by systemd.
	ps.start(stageListeners, "watchdog", watchdog(log, d.StateErr), nil)
	log.Info("warmfleet daemon started", "node", f.nodeName, "data_dir", f.dataDir, "api", addr.String(), "version", Version())
	if started != nil {
		started()
	}
	running = true
	return ps.Wait()
}

// leaveAtStop is gossip as a part: it runs until its stage stops, then
// leaves the fleet.
func leaveAtStop(log *slog.Logger, node *gossip.Node) func(context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		leaveFleet(log, node)
		return nil
	}
}

// watchdog tells systemd the binary is ready and feeds its watchdog while
// alive (nil: always) reports no error, until its stage stops; then it
// tells systemd the binary is stopping.
func watchdog(log *slog.Logger, alive func() error) func(context.Context) error {
	return func(ctx context.Context) error {
		stopping := sdnotify.FromEnv(log).Serving(alive)
		<-ctx.Done()
		stopping()
		return nil
	}
}

// leaveWait is how long a leave may wait for the fleet to hear it: hardly
// at all when no other member is alive to hear it.
func leaveWait(members []gossip.Member) time.Duration {
	if !othersAlive(members) {
		return time.Millisecond
	}
	return leaveTimeout
}

// leaveFleet says goodbye to the fleet and stops gossip. The goodbye is
// bounded by leaveTimeout and not waited for when no other member is alive;
// a goodbye nobody took is not worth a line at every whole-fleet stop.
func leaveFleet(log *slog.Logger, node *gossip.Node) {
	ctx, cancel := context.WithTimeout(context.Background(), leaveWait(node.Members()))
	defer cancel()
	if err := node.Close(ctx); err != nil {
		log.Debug("leave the fleet", "err", err)
	}
}

// apiServer serves the daemon's API with the probe listener's timeouts:
// requests are small and come from this host or the fleet's tooling, so a
// client that stalls mid-request or leaves a connection idle is cut off,
// and abandoned connections do not pile up (each holds a descriptor and a
// goroutine) or stall a shutdown. Answers are not bounded: `cache verify`
// answers when the whole cache is re-hashed.
func apiServer(h http.Handler) *http.Server {
	srv := health.Server(h)
	srv.WriteTimeout = 0
	return srv
}

// defaultContainerdSocket is where containerd listens on a Kubernetes node.
const defaultContainerdSocket = "/run/containerd/containerd.sock"

// dialContainerd connects the image cache. Without --containerd it uses the
// default socket when there is one and runs without image caching when not.
func dialContainerd(ctx context.Context, log *slog.Logger, f *daemonFlags, base *daemon.Base) (*imagecache.Cache, error) {
	addr := f.containerd
	switch addr {
	case "off":
		return nil, nil
	case "":
		if _, err := os.Stat(defaultContainerdSocket); err != nil {
			log.Info("image cache off: no containerd socket", "path", defaultContainerdSocket)
			return nil, nil
		}
		addr = "unix://" + defaultContainerdSocket
	}
	c, err := imagecache.Dial(ctx, addr, imagecache.Options{
		Namespace: f.containerdNS, HostsDir: f.registryHosts, DockerConfig: f.registryAuth,
		Registerer: base.Registry(), Logger: log.With("component", "images"),
	})
	if err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	return c, nil
}

// startGossip makes the daemon a fleet member; peerAddr and peerKey are the
// swarm's advertised address and identity key (empty without a swarm).
func startGossip(ctx context.Context, log *slog.Logger, f *daemonFlags, labels map[string]string, apiAddr api.Addr, base *daemon.Base, peerAddr string, peerKey []byte) (*gossip.Node, error) {
	var keys [][]byte
	switch {
	case f.clusterKeyFile != "" && f.insecureGossip:
		return nil, usageError("--cluster-key-file and --insecure-gossip exclude each other")
	case f.clusterKeyFile != "":
		var err error
		if keys, err = gossip.LoadKeyFile(f.clusterKeyFile); err != nil {
			return nil, usageError("%v", err)
		}
	case !f.insecureGossip:
		return nil, usageError("gossip needs --cluster-key-file (warmfleet keygen writes one), or --insecure-gossip for development")
	default:
		log.Warn("gossip runs WITHOUT encryption or authentication (--insecure-gossip)")
	}
	meta := gossip.Meta{Zone: f.zone, Version: Version(), PeerAddr: peerAddr, PeerKey: peerKey}
	if apiAddr.Network == "tcp" {
		meta.APIAddr = apiAddr.Address
	}
	return gossip.Start(ctx, gossip.Config{
		NodeName: f.nodeName, BindAddr: f.gossipAddr, AdvertiseAddr: f.advertise, Join: f.join,
		Keyring: keys, KeyFile: f.clusterKeyFile, Insecure: f.insecureGossip, Labels: labels, Role: gossip.RoleNode, Meta: meta,
		Desired: base.Desired(), Logger: log.With("component", "gossip"), Registerer: base.Registry(), Now: f.clock,
	})
}

// swarmFleet is what the swarm asks of the fleet once gossip runs: the
// cluster keys in use, and the identity key pinned to each member's name.
type swarmFleet interface {
	Keys() [][]byte
	PeerKey(name string) []byte
}

// fleetKeys is the swarm's key directory: the identity keys the fleet
// pinned to member names; none before gossip runs.
type fleetKeys func() swarmFleet

func (k fleetKeys) PeerKey(name string) []byte {
	if g := k(); g != nil {
		return g.PeerKey(name)
	}
	return nil
}

// startSwarm opens the peer listener. Peers authenticate with the cluster
// key, so the swarm needs one, and prove who they are with the identity key
// each node keeps in its data directory (made on first start); fleet is
// nil until gossip runs.
func startSwarm(ctx context.Context, log *slog.Logger, f *daemonFlags, fleet func() swarmFleet) (net.Listener, *p2p.Node, error) {
	if f.gossipAddr == "" || f.clusterKeyFile == "" {
		return nil, nil, usageError("--p2p needs --gossip and --cluster-key-file: peers find each other by gossip and authenticate with the cluster key")
	}
	keys, err := gossip.LoadKeyFile(f.clusterKeyFile)
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	if f.p2pMaxUploads < 1 {
		return nil, nil, usageError("--p2p-max-uploads must be at least 1, got %d", f.p2pMaxUploads)
	}
	identity, err := p2p.LoadIdentity(filepath.Join(f.dataDir, p2p.IdentityFile))
	if err != nil {
		return nil, nil, err
	}
	keyring := func() [][]byte {
		if g := fleet(); g != nil {
			if ks := g.Keys(); len(ks) > 0 {
				return ks
			}
		}
		return keys
	}
	node, err := p2p.NewNode(p2p.Config{NodeID: f.nodeName, Keyring: keyring, Identity: identity, PeerKeys: fleetKeys(fleet), Logger: log.With("component", "p2p"),
		MaxUploads: f.p2pMaxUploads, UploadLimit: float64(f.p2pUpload), DownloadLimit: float64(f.p2pDownload), Encrypt: f.p2pEncrypt})
	if err != nil {
		return nil, nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", f.p2pAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("p2p listener: %w", err)
	}
	return ln, node, nil
}

// peerAdvertise is the peer address members dial: --p2p-advertise, else
// --p2p with the gossip host for an unspecified one and, for port 0, the
// port the listener bound (bound, the listener's address).
func peerAdvertise(f *daemonFlags, bound net.Addr) string {
	if f.p2pAdvertise != "" {
		return f.p2pAdvertise
	}
	host, port, err := net.SplitHostPort(f.p2pAddr)
	if err != nil {
		return f.p2pAddr
	}
	if tcp, ok := bound.(*net.TCPAddr); ok && port == "0" {
		port = strconv.Itoa(tcp.Port)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		gossipAddr := f.advertise
		if gossipAddr == "" {
			gossipAddr = f.gossipAddr
		}
		if gh, _, err := net.SplitHostPort(gossipAddr); err == nil {
			host = gh
		}
	}
	return net.JoinHostPort(host, port)
}

// parseWithConfig fills the flags of fs not given on the command line from
// the environment, then from the --config file at *configPath.
func parseWithConfig(fs *flagSet, e *Env, configPath *string) error {
	if err := layerFlags(fs, e, nil); err != nil {
		return err
	}
	if *configPath == "" {
		return nil
	}
	file, err := loadConfigFile(*configPath)
	if err != nil {
		return usageError("%v", err)
	}
	return layerFlags(fs, e, file)
}

func newLogger(e *Env, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(e.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(e.Stderr, opts)), nil
	default:
		return nil, usageError("--log-format %q: want text or json", format)
	}
}

func readToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 16 {
		return "", fmt.Errorf("api token in %s: want at least 16 characters", path)
	}
	return tok, nil
}
