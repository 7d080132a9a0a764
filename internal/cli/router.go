package cli

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/fleet"
	"github.com/warmfleet/warmfleet/router/peer"
	"github.com/warmfleet/warmfleet/router/prefix"
)

// urlList is a repeatable flag that also takes comma-separated values (so
// WARMFLEET_BACKEND can list several).
type urlList []string

func (l *urlList) String() string { return strings.Join(*l, ",") }

// Type names the value in help.
func (l *urlList) Type() string { return "urls" }

func (l *urlList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		u, err := router.ParseBackendURL(s)
		if err != nil {
			return err
		}
		*l = append(*l, u)
	}
	return nil
}

type strategyFlag struct{ s *balance.Strategy }

func (f strategyFlag) String() string {
	if f.s == nil {
		return ""
	}
	return string(*f.s)
}

// Type names the value in help.
func (f strategyFlag) Type() string { return "strategy" }

func (f strategyFlag) Set(v string) error {
	s, err := balance.ParseStrategy(v)
	if err != nil {
		return err
	}
	*f.s = s
	return nil
}

func routerCommand(e *Env) *cobra.Command {
	f := &routerFlags{set: map[string]bool{}}
	cmd := &cobra.Command{
		Use:   "router",
		Short: "run the prefix-aware OpenAI-compatible router",
		Long: `Run the router: an OpenAI-compatible API (--listen) that sends each request to
a backend of its model that likely holds the prompt's prefix in its KV cache.
Backends come from --backend, a --config file, or the fleet (--join): then
every endpoint the daemons register is a backend once its node has the model
ready. The admin listener serves /metrics, /admin/*, the /ui status page and
/debug/pprof/.`,
		Example: `  warmfleet router --backend http://10.0.0.5:8000 --backend http://10.0.0.6:8000
  warmfleet router --join 10.0.0.5:7946 --cluster-key-file /etc/warmfleet/cluster.key --gossip 0.0.0.0:7948
  warmfleet router --config /etc/warmfleet/router.yaml`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneRouterGC()
			s, err := f.setup(e, cmd.Flags())
			if err != nil {
				return err
			}
			return routerRoot(cmd.Context(), f, s, nil)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// kvEventsFlag is the repeatable --kv-events BACKEND_URL=ADDRESS.
type kvEventsFlag map[string]string

func (f kvEventsFlag) String() string { return "" }

// Type names the value in help.
func (f kvEventsFlag) Type() string { return "backend=address" }

func (f kvEventsFlag) Set(v string) error {
	u, addr, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("%q: want BACKEND_URL=tcp://HOST:PORT (or =bind:tcp://HOST:PORT)", v)
	}
	url, err := router.ParseBackendURL(u)
	if err != nil {
		return err
	}
	if _, _, err := router.ParseKVEvents(addr); err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	if _, dup := f[url]; dup {
		return fmt.Errorf("%s: given twice", url)
	}
	f[url] = addr
	return nil
}

// routerFlags are the router's settings, from flags and env.
type routerFlags struct {
	listen, adminListen, adminTokenFile string
	forward                             listFlag
	firstByte, responseTimeout          time.Duration
	idleTimeout                         time.Duration
	logLevel, logFormat                 string
	backends                            urlList
	kvEvents                            kvEventsFlag
	strategy                            balance.Strategy
	configFile                          string
	configPoll                          time.Duration
	hashKeyFile                         string
	loadFactor                          float64
	maxInflight                         int
	maxBody                             int64
	join                                listFlag
	gossipAddr, advertise               string
	clusterKeyFile                      string
	insecureGossip                      bool
	nodeName                            string
	peers                               urlList
	peerListen, peerAdvertise           string
	// set holds the flags given explicitly: they override the config file.
	set map[string]bool
}

func (f *routerFlags) register(fs *flagSet) {
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address for the OpenAI-compatible API")
	fs.StringVar(&f.adminListen, "admin-listen", "127.0.0.1:9180", "private address for /metrics, /admin/*, the /ui status page and /debug/pprof/ (empty: off)")
	fs.StringVar(&f.adminTokenFile, "admin-token-file", "", "file holding the bearer token the admin listener requires (needed for a non-loopback --admin-listen)")
	fs.Var(&f.forward, "forward-path", "path prefix the API forwards to backends (repeatable, or comma-separated; replaces the default "+strings.Join(router.DefaultForwardPaths, ",")+"; config key forward_paths)")
	fs.DurationVar(&f.firstByte, "first-byte-timeout", router.Defaults().FirstByteTimeout, "longest wait for a backend's first byte of a streamed answer (or another path's) before trying another backend")
	fs.DurationVar(&f.responseTimeout, "response-timeout", router.Defaults().ResponseTimeout, "the same for a non-streamed completion, whose first byte comes with the whole answer")
	fs.DurationVar(&f.idleTimeout, "idle-timeout", router.Defaults().IdleTimeout, "longest gap between two chunks of an answer; a backend that misses it has broken the answer")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json")
	fs.Var(&f.backends, "backend", "backend base URL (repeatable, or comma-separated); added to the config file's backends")
	f.kvEvents = kvEventsFlag{}
	fs.Var(f.kvEvents, "kv-events", "BACKEND_URL=tcp://HOST:PORT: where that backend's engine publishes its KV-cache events (vLLM binds; bind:tcp://HOST:PORT when the router binds and the engine connects, as llm-d-inference-sim does); repeatable; config key kv_events")
	f.strategy = router.Defaults().Strategy
	fs.Var(strategyFlag{&f.strategy}, "strategy", "default strategy: prefix-aware, self-tuning (the lowest expected time to first token by costs learned per backend), kv-aware (prefix-aware ranked by the engines' KV events), least-outstanding, random, or one of the field's policies: prefix-hash, cache-aware (SGLang), bounded-load (consistent hashing with bounded loads), session (HyperPod; pins X-Session-Id or the body's user)")
	fs.StringVar(&f.configFile, "config", "", "YAML config file (backends, per-model strategies, limits); re-read on SIGHUP")
	fs.DurationVar(&f.configPoll, "config-poll", 0, "also re-read --config this often and reload it when its content changed, e.g. a mounted ConfigMap (0: off)")
	fs.StringVar(&f.hashKeyFile, "hash-key-file", "", "per-fleet secret keying prompt hashes (replicas must share it; default: random per process)")
	fs.Float64Var(&f.loadFactor, "load-factor", router.Defaults().LoadFactor, "c: no backend above ceil(c x mean in-flight)")
	fs.IntVar(&f.maxInflight, "max-inflight", 0, "default per-backend concurrency limit (0: none)")
	fs.Int64Var(&f.maxBody, "max-body-bytes", 16<<20, "largest accepted request body")
	fs.Var(&f.join, "join", "fleet members to join, host:port (repeatable): endpoints are then learned from gossip")
	fs.StringVar(&f.gossipAddr, "gossip", "0.0.0.0:7947", "gossip bind address ip:port, with --join")
	fs.StringVar(&f.advertise, "advertise", "", "gossip address other members should use, if not --gossip")
	fs.StringVar(&f.clusterKeyFile, "cluster-key-file", "", "the fleet's cluster key file; also keys prompt hashes when --hash-key-file is not given")
	fs.BoolVar(&f.insecureGossip, "insecure-gossip", false, "DEV ONLY: gossip without encryption or authentication")
	host, _ := os.Hostname()
	fs.StringVar(&f.nodeName, "node-name", host+"-router", "this router's name in the fleet (and among its peer replicas)")
	fs.Var(&f.peers, "peer", "a peer replica's --peer-listen URL (repeatable): replicas stream what they route to each other and route from one view")
	fs.StringVar(&f.peerListen, "peer-listen", "", "address taking peer replicas' event streams (empty: off); peers prove they hold the fleet's key. With --join, other routers find it through gossip")
	fs.StringVar(&f.peerAdvertise, "peer-advertise", "", "host:port other routers should stream to, if not --peer-listen (default: its port on the --advertise or --gossip host)")
}

// load builds the configuration: file, then flags given explicitly. It
// returns the digest of the file's content it loaded (zero without one).
func (f *routerFlags) load() (router.Config, [sha256.Size]byte, error) {
	cfg := router.Defaults()
	var digest [sha256.Size]byte
	if f.configFile != "" {
		loaded, b, err := router.LoadConfig(f.configFile)
		if err != nil {
			return loaded, digest, err
		}
		cfg, digest = loaded, sha256.Sum256(b)
	}
	if f.set["strategy"] || f.configFile == "" {
		cfg.Strategy = f.strategy
	}
	if f.set["load-factor"] {
		cfg.LoadFactor = f.loadFactor
	}
	if f.set["max-inflight"] {
		cfg.MaxInflight = f.maxInflight
	}
	if f.set["max-body-bytes"] {
		cfg.MaxBodyBytes = f.maxBody
	}
	if f.set["hash-key-file"] {
		cfg.HashKeyFile = f.hashKeyFile
	}
	if f.set["forward-path"] {
		cfg.ForwardPaths = slices.Clone([]string(f.forward))
	}
	for _, d := range []struct {
		flag     string
		dst, val *time.Duration
	}{
		{"first-byte-timeout", &cfg.FirstByteTimeout, &f.firstByte},
		{"response-timeout", &cfg.ResponseTimeout, &f.responseTimeout},
		{"idle-timeout", &cfg.IdleTimeout, &f.idleTimeout},
	} {
		if f.set[d.flag] {
			*d.dst = *d.val
		}
	}
	for _, b := range f.backends {
		cfg.Backends = append(cfg.Backends, router.BackendConfig{URL: b})
	}
	for u, addr := range f.kvEvents {
		found := false
		for i := range cfg.Backends {
			if b, err := router.ParseBackendURL(cfg.Backends[i].URL); err == nil && b == u {
				cfg.Backends[i].KVEvents, found = addr, true
			}
		}
		if !found {
			return cfg, digest, fmt.Errorf("--kv-events %s: not a configured backend (give it with --backend or in --config)", u)
		}
	}
	return cfg, digest, cfg.Validate()
}

// routerSetup is what the router's flags resolve to before any part runs.
type routerSetup struct {
	log        *slog.Logger
	adminToken string
	cfg        router.Config
	// cfgDigest is the digest of the config file's content cfg was
	// loaded from: the watcher starts later, and a change made in between
	// must still count as one.
	cfgDigest   [sha256.Size]byte
	clusterKeys [][]byte
	hashKey     prefix.Key
	// material is the secret peers prove they hold (nil: a random key).
	material []byte
	// advertisedPeer is the peer address announced by gossip ("" for none).
	advertisedPeer string
}

// parseRouter parses `warmfleet router ARGS` and checks the settings.
func parseRouter(e *Env, args []string) (*routerFlags, *routerSetup, error) {
	fs := newFlagSet(e, "router")
	f := &routerFlags{set: map[string]bool{}}
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return nil, nil, usageError("unexpected arguments %q", fs.Args())
	}
	s, err := f.setup(e, fs)
	return f, s, err
}

// setup fills the flags of fs (f's) not given from the environment and
// checks the settings.
func (f *routerFlags) setup(e *Env, fs *flagSet) (*routerSetup, error) {
	if err := layerFlags(fs, e, nil); err != nil {
		return nil, err
	}
	if f.configPoll < 0 {
		return nil, usageError("--config-poll %v: want a duration >= 0 (0: off)", f.configPoll)
	}
	fs.Visit(func(fl *pflag.Flag) { f.set[fl.Name] = true })
	s := &routerSetup{}
	var err error
	if s.log, err = newLogger(e, f.logLevel, f.logFormat); err != nil {
		return nil, err
	}
	if s.adminToken, err = readToken(f.adminTokenFile); err != nil {
		return nil, usageError("--admin-token-file: %v", err)
	}
	if f.adminListen != "" && s.adminToken == "" && !(api.Addr{Network: "tcp", Address: f.adminListen}).Loopback() {
		return nil, usageError("--admin-listen %s is reachable from other hosts: give a bearer token (--admin-token-file)", f.adminListen)
	}
	if s.cfg, s.cfgDigest, err = f.load(); err != nil {
		return nil, usageError("%v", err)
	}
	if len(s.cfg.Backends) == 0 && len(f.join) == 0 {
		return nil, usageError("no backends: give --backend URL, a --config file with backends, or --join a fleet")
	}
	if f.clusterKeyFile != "" {
		if s.clusterKeys, err = gossip.LoadKeyFile(f.clusterKeyFile); err != nil {
			return nil, usageError("%v", err)
		}
	}
	if len(f.join) > 0 && len(s.clusterKeys) == 0 && !f.insecureGossip {
		return nil, usageError("--join needs --cluster-key-file (or --insecure-gossip for development)")
	}
	if s.hashKey, s.material, err = hashKey(s.cfg.HashKeyFile, s.clusterKeys, s.log); err != nil {
		return nil, err
	}
	if (len(f.peers) > 0 || f.peerListen != "") && s.material == nil {
		return nil, usageError("--peer and --peer-listen need --cluster-key-file or --hash-key-file: peers prove they hold that key")
	}
	if f.peerListen != "" && len(f.join) > 0 {
		if s.advertisedPeer, err = peerAddress(f.peerAdvertise, f.peerListen, f.advertise, f.gossipAddr); err != nil {
			return nil, usageError("%v", err)
		}
		if s.advertisedPeer == "" {
			s.log.Warn("no routable peer address to advertise: other routers will not find this one; give --peer-advertise", "peer_listen", f.peerListen)
		}
	}
	return s, nil
}

// serveRouter runs `warmfleet router ARGS` until ctx ends; onListen, if not
// nil, is told the API's address once it listens (the demo asks for port 0).
func serveRouter(ctx context.Context, e *Env, args []string, onListen func(net.Addr)) error {
	f, s, err := parseRouter(e, args)
	if err != nil {
		return err
	}
	return routerRoot(ctx, f, s, onListen)
}

// The router's shutdown stages after stageListeners, in order.
const (
	// stageRouting stops the router's loops: health probes, the peer link,
	// configuration reloads and the fleet watcher.
	stageRouting = stageListeners + 1 + iota
	// stageRouterGossip leaves the fleet.
	stageRouterGossip
)

// routerShutdownGrace is how long streams in flight may run on at a stop.
const routerShutdownGrace = 30 * time.Second

// routerRoot is the router's composition root: it builds the parts (gossip
// and the fleet's endpoint source, the peer link, the router, the API,
// admin and peer listeners, every address taken before anything serves),
// runs them as parts and, when ctx ends or a part fails, stops them in this
// order: the listeners (streams in flight may finish) and the watchdog; the
// router's loops, the peer link, the reloaders and the fleet watcher; then
// gossip (leave the fleet). The first part to fail is the error returned.
func routerRoot(ctx context.Context, f *routerFlags, s *routerSetup, onListen func(net.Addr)) error {
	log, cfg := s.log, s.cfg
	var link *peer.Link
	if len(f.peers) > 0 || f.peerListen != "" {
		var err error
		if link, err = peer.NewLink(f.nodeName, f.peers, peer.Secret(s.material), log.With("component", "peers"), nil); err != nil {
			return usageError("%v", err)
		}
	}
	ps := newParts(ctx)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var staticMu sync.Mutex
	static := router.StaticEndpoints(&cfg)
	staticEndpoints := func() []router.Endpoint {
		staticMu.Lock()
		defer staticMu.Unlock()
		return slices.Clone(static)
	}
	var src router.EndpointSource
	var setStatic func([]router.Endpoint)
	if len(f.join) > 0 {
		node, err := gossip.Start(ps.ctx, gossip.Config{
			NodeName: f.nodeName, BindAddr: f.gossipAddr, AdvertiseAddr: f.advertise, Join: f.join, Keyring: s.clusterKeys, KeyFile: f.clusterKeyFile,
			Insecure: f.insecureGossip, Role: gossip.RoleRouter, Meta: gossip.Meta{APIAddr: f.listen, PeerAddr: s.advertisedPeer, Version: Version()},
			Logger: log.With("component", "gossip"), Registerer: reg,
		})
		if err != nil {
			return ps.fail(err)
		}
		ps.start(stageRouterGossip, "gossip", leaveAtStop(log, node), nil)
		var onMembers func([]gossip.Member)
		if link != nil {
			// Routers that advertise a peer address stream to each other
			// without being listed: add or drop them as they come and go.
			onMembers = func(members []gossip.Member) {
				link.SetPeers(append(slices.Clone([]string(f.peers)), fleet.RouterPeers(members)...))
			}
		}
		fleetSrc := fleet.New(node, staticEndpoints, onMembers)
		ps.start(stageRouting, "fleet watcher", fleetSrc.Run, nil)
		src, setStatic = fleetSrc, func(eps []router.Endpoint) {
			staticMu.Lock()
			static = eps
			staticMu.Unlock()
			fleetSrc.Refresh()
		}
	} else {
		ss := router.NewStaticSource(static, nil)
		src, setStatic = ss, ss.Set
	}
	opts := router.Options{Source: src, Registry: reg, Logger: log, HashKey: s.hashKey}
	if link != nil {
		opts.OnEvent = link.Send
		reg.MustRegister(link)
	}
	rt, err := router.New(cfg, opts)
	if err != nil {
		return ps.fail(err)
	}
	var reloadMu sync.Mutex
	reload := func() error {
		reloadMu.Lock()
		defer reloadMu.Unlock()
		next, _, err := f.load()
		if err != nil {
			return err
		}
		if next.HashKeyFile != cfg.HashKeyFile {
			return errors.New("hash_key_file cannot change without a restart")
		}
		if err := rt.Apply(next); err != nil {
			return err
		}
		setStatic(router.StaticEndpoints(&next))
		log.Info("configuration reloaded", "backends", len(next.Backends), "strategy", next.Strategy)
		return nil
	}

	servers, listeners, err := routerListeners(f, s, rt, reg, reload, log)
	if err != nil {
		return ps.fail(err)
	}
	ps.start(stageRouting, "router", rt.Run, nil)
	if link != nil {
		ps.start(stageRouting, "peer link", func(ctx context.Context) error {
			link.Run(ctx, rt.LoadEvents)
			return nil
		}, nil)
	}
	// SIGHUP is caught from here on: it reloads rather than ends the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ps.start(stageRouting, "reload on SIGHUP", func(ctx context.Context) error {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-hup:
				if err := reload(); err != nil {
					log.Error("reload failed; keeping the running configuration", "err", err)
				}
			}
		}
	}, nil)
	if f.configFile != "" && f.configPoll > 0 {
		ps.start(stageRouting, "config watcher", func(ctx context.Context) error {
			watchConfigFile(ctx, f.configFile, s.cfgDigest, f.configPoll, reload, log)
			return nil
		}, nil)
	}
	for i, srv := range servers {
		l := listeners[i]
		log.Info("listening", "addr", l.Addr().String())
		if i == 0 && onListen != nil {
			onListen(l.Addr())
		}
		ps.start(stageListeners, "listener "+srv.Addr, serveHTTP(srv, l), shutdownHTTP(srv, routerShutdownGrace, nil))
	}
	ps.start(stageListeners, "watchdog", watchdog(log, nil), nil) // every address listens
	return ps.Wait()
}

// routerListeners builds the API server (first), the admin and the peer
// servers, and takes every address before anything serves: a bad or busy
// one is then an error and an exit, not a server left running with no way
// to stop it.
func routerListeners(f *routerFlags, s *routerSetup, rt *router.Router, reg *prometheus.Registry, reload func() error, log *slog.Logger) ([]*http.Server, []net.Listener, error) {
	servers := []*http.Server{{Addr: f.listen, Handler: rt, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}}
	if f.adminListen != "" {
		servers = append(servers, &http.Server{Addr: f.adminListen, Handler: rt.AdminHandler(reg, reload, s.adminToken), ReadHeaderTimeout: 10 * time.Second})
	}
	if f.peerListen != "" {
		mux := http.NewServeMux()
		streams := peer.NewHandler(f.nodeName, peer.Secret(s.material), rt, log.With("component", "peers"), nil)
		mux.Handle(peer.Path, streams)
		srv := &http.Server{Addr: f.peerListen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		srv.RegisterOnShutdown(streams.Close) // peers' streams last as long as they run
		servers = append(servers, srv)
	}
	listeners := make([]net.Listener, 0, len(servers))
	for _, srv := range servers {
		l, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return nil, nil, fmt.Errorf("listen %s: %w", srv.Addr, err)
		}
		listeners = append(listeners, l)
	}
	return servers, listeners, nil
}

// peerAddress is the host:port a router advertises for peer streams:
// explicit, else --peer-listen's port on the first specified host of
// listen, advertise and gossip; "" when none is routable.
func peerAddress(explicit, listen, advertise, gossipAddr string) (string, error) {
	if explicit != "" {
		if _, _, err := net.SplitHostPort(explicit); err != nil {
			return "", fmt.Errorf("--peer-advertise %q: %w", explicit, err)
		}
		return explicit, nil
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--peer-listen %q: %w", listen, err)
	}
	if port == "0" {
		return "", fmt.Errorf("--peer-listen %q: other routers need a fixed port to find this one", listen)
	}
	for _, addr := range []string{listen, advertise, gossipAddr} {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
			return net.JoinHostPort(host, port), nil
		}
	}
	return "", nil
}

// hashKey reads the per-fleet secret, else derives it from the cluster key,
// else makes a random one (then several router replicas would not agree on
// cold choices). It also returns the secret material it came from (nil for
// a random key), which peer replicas prove they hold.
func hashKey(file string, clusterKeys [][]byte, log *slog.Logger) (prefix.Key, []byte, error) {
	if file == "" && len(clusterKeys) > 0 {
		return prefix.KeyFromBytes(append([]byte("warmfleet router prompt hashes\x00"), clusterKeys[0]...)), clusterKeys[0], nil
	}
	if file == "" {
		var b [32]byte
		_, _ = rand.Read(b[:])
		log.Warn("no hash key file: using a random key; router replicas will not agree on placements")
		return prefix.KeyFromBytes(b[:]), nil, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return prefix.Key{}, nil, fmt.Errorf("hash key: %w", err)
	}
	if len(strings.TrimSpace(string(b))) < 16 {
		return prefix.Key{}, nil, fmt.Errorf("hash key file %s: want at least 16 bytes of secret", file)
	}
	return prefix.KeyFromBytes(b), b, nil
}

// tuneRouterGC lets the heap grow to 5x what is live between collections
// unless GOGC says otherwise. The router's live heap is small (the prefix
// index and buffers), and each collection's pause on a busy 2-core machine
// was what set the p99 of the latency the router adds: at 1,000 req/s, added
// p99 0.50 ms with GOGC=400 vs 0.56 ms with the default (median of 3 each,
// same binary, alternating).
func tuneRouterGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}
