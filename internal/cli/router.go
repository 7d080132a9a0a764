package cli

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
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
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/sdnotify"
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

func (f strategyFlag) Set(v string) error {
	s, err := balance.ParseStrategy(v)
	if err != nil {
		return err
	}
	*f.s = s
	return nil
}

func runRouter(ctx context.Context, e *Env, args []string) error {
	tuneRouterGC()
	return serveRouter(ctx, e, args, nil)
}

// serveRouter runs `warmfleet router ARGS` until ctx ends; onListen, if not
// nil, is told the API's address once it listens (the demo asks for port 0).
func serveRouter(ctx context.Context, e *Env, args []string, onListen func(net.Addr)) error {
	fs := newFlagSet(e, "router")
	listen := fs.String("listen", "127.0.0.1:8080", "address for the OpenAI-compatible API")
	adminListen := fs.String("admin-listen", "127.0.0.1:9180", "private address for /metrics, /admin/* and the /ui status page (empty: off)")
	adminTokenFile := fs.String("admin-token-file", "", "file holding the bearer token the admin listener requires (needed for a non-loopback --admin-listen)")
	var forward listFlag
	fs.Var(&forward, "forward-path", "path prefix the API forwards to backends (repeatable, or comma-separated; replaces the default "+strings.Join(router.DefaultForwardPaths, ",")+"; config key forward_paths)")
	firstByte := fs.Duration("first-byte-timeout", router.Defaults().FirstByteTimeout, "longest wait for a backend's first byte of a streamed answer (or another path's) before trying another backend")
	responseTimeout := fs.Duration("response-timeout", router.Defaults().ResponseTimeout, "the same for a non-streamed completion, whose first byte comes with the whole answer")
	idleTimeout := fs.Duration("idle-timeout", router.Defaults().IdleTimeout, "longest gap between two chunks of an answer; a backend that misses it has broken the answer")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text or json")
	var backends urlList
	fs.Var(&backends, "backend", "backend base URL (repeatable, or comma-separated); added to the config file's backends")
	strategy := balance.PrefixAware
	fs.Var(strategyFlag{&strategy}, "strategy", "default strategy: prefix-aware, least-outstanding or random")
	configFile := fs.String("config", "", "YAML config file (backends, per-model strategies, limits); re-read on SIGHUP")
	configPoll := fs.Duration("config-poll", 0, "also re-read --config this often and reload it when its content changed, e.g. a mounted ConfigMap (0: off)")
	hashKeyFile := fs.String("hash-key-file", "", "per-fleet secret keying prompt hashes (replicas must share it; default: random per process)")
	loadFactor := fs.Float64("load-factor", router.Defaults().LoadFactor, "c: no backend above ceil(c x mean in-flight)")
	maxInflight := fs.Int("max-inflight", 0, "default per-backend concurrency limit (0: none)")
	maxBody := fs.Int64("max-body-bytes", 16<<20, "largest accepted request body")
	var join listFlag
	fs.Var(&join, "join", "fleet members to join, host:port (repeatable): endpoints are then learned from gossip")
	gossipAddr := fs.String("gossip", "0.0.0.0:7947", "gossip bind address ip:port, with --join")
	advertise := fs.String("advertise", "", "gossip address other members should use, if not --gossip")
	clusterKeyFile := fs.String("cluster-key-file", "", "the fleet's cluster key file; also keys prompt hashes when --hash-key-file is not given")
	insecureGossip := fs.Bool("insecure-gossip", false, "DEV ONLY: gossip without encryption or authentication")
	host, _ := os.Hostname()
	nodeName := fs.String("node-name", host+"-router", "this router's name in the fleet (and among its peer replicas)")
	var peers urlList
	fs.Var(&peers, "peer", "a peer replica's --peer-listen URL (repeatable): replicas stream what they route to each other and route from one view")
	peerListen := fs.String("peer-listen", "", "address taking peer replicas' event streams (empty: off); peers prove they hold the fleet's key. With --join, other routers find it through gossip")
	peerAdvertise := fs.String("peer-advertise", "", "host:port other routers should stream to, if not --peer-listen (default: its port on the --advertise or --gossip host)")
	if err := parseFlags(fs, e, args, nil); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	if *configPoll < 0 {
		return usageError("--config-poll %v: want a duration >= 0 (0: off)", *configPoll)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	log, lerr := newLogger(e, *logLevel, *logFormat)
	if lerr != nil {
		return lerr
	}
	adminToken, terr := readToken(*adminTokenFile)
	if terr != nil {
		return usageError("--admin-token-file: %v", terr)
	}
	if *adminListen != "" && adminToken == "" && !(api.Addr{Network: "tcp", Address: *adminListen}).Loopback() {
		return usageError("--admin-listen %s is reachable from other hosts: give a bearer token (--admin-token-file)", *adminListen)
	}

	// load builds the configuration: file, then flags given explicitly.
	load := func() (router.Config, error) {
		cfg := router.Defaults()
		if *configFile != "" {
			var err error
			if cfg, err = router.LoadConfig(*configFile); err != nil {
				return cfg, err
			}
		}
		if set["strategy"] || *configFile == "" {
			cfg.Strategy = strategy
		}
		if set["load-factor"] {
			cfg.LoadFactor = *loadFactor
		}
		if set["max-inflight"] {
			cfg.MaxInflight = *maxInflight
		}
		if set["max-body-bytes"] {
			cfg.MaxBodyBytes = *maxBody
		}
		if set["hash-key-file"] {
			cfg.HashKeyFile = *hashKeyFile
		}
		if set["forward-path"] {
			cfg.ForwardPaths = slices.Clone([]string(forward))
		}
		for _, d := range []struct {
			flag     string
			dst, val *time.Duration
		}{
			{"first-byte-timeout", &cfg.FirstByteTimeout, firstByte},
			{"response-timeout", &cfg.ResponseTimeout, responseTimeout},
			{"idle-timeout", &cfg.IdleTimeout, idleTimeout},
		} {
			if set[d.flag] {
				*d.dst = *d.val
			}
		}
		for _, b := range backends {
			cfg.Backends = append(cfg.Backends, router.BackendConfig{URL: b})
		}
		return cfg, cfg.Validate()
	}
	cfg, err := load()
	if err != nil {
		return usageError("%v", err)
	}
	if len(cfg.Backends) == 0 && len(join) == 0 {
		return usageError("no backends: give --backend URL, a --config file with backends, or --join a fleet")
	}
	var clusterKeys [][]byte
	if *clusterKeyFile != "" {
		if clusterKeys, err = gossip.LoadKeyFile(*clusterKeyFile); err != nil {
			return usageError("%v", err)
		}
	}
	if len(join) > 0 && len(clusterKeys) == 0 && !*insecureGossip {
		return usageError("--join needs --cluster-key-file (or --insecure-gossip for development)")
	}
	key, material, err := hashKey(cfg.HashKeyFile, clusterKeys, log)
	if err != nil {
		return err
	}
	var link *peer.Link
	if len(peers) > 0 || *peerListen != "" {
		if material == nil {
			return usageError("--peer and --peer-listen need --cluster-key-file or --hash-key-file: peers prove they hold that key")
		}
		if link, err = peer.NewLink(*nodeName, peers, peer.Secret(material), log.With("component", "peers"), nil); err != nil {
			return usageError("%v", err)
		}
	}
	advertisedPeer := ""
	if *peerListen != "" && len(join) > 0 {
		if advertisedPeer, err = peerAddress(*peerAdvertise, *peerListen, *advertise, *gossipAddr); err != nil {
			return usageError("%v", err)
		}
		if advertisedPeer == "" {
			log.Warn("no routable peer address to advertise: other routers will not find this one; give --peer-advertise", "peer_listen", *peerListen)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
	if len(join) > 0 {
		node, err := gossip.Start(ctx, gossip.Config{
			NodeName: *nodeName, BindAddr: *gossipAddr, AdvertiseAddr: *advertise, Join: join, Keyring: clusterKeys, KeyFile: *clusterKeyFile,
			Insecure: *insecureGossip, Role: gossip.RoleRouter, Meta: gossip.Meta{APIAddr: *listen, PeerAddr: advertisedPeer, Version: Version()},
			Logger: log.With("component", "gossip"), Registerer: reg,
		})
		if err != nil {
			return err
		}
		defer func() {
			leave, stop := context.WithTimeout(context.Background(), 5*time.Second)
			defer stop()
			_ = node.Close(leave)
		}()
		var onMembers func([]gossip.Member)
		if link != nil {
			// Routers that advertise a peer address stream to each other
			// without being listed: add or drop them as they come and go.
			onMembers = func(members []gossip.Member) {
				link.SetPeers(append(slices.Clone([]string(peers)), fleet.RouterPeers(members)...))
			}
		}
		fleetSrc := fleet.Watch(ctx, node, staticEndpoints, onMembers)
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
	opts := router.Options{Source: src, Registry: reg, Logger: log, HashKey: key}
	if link != nil {
		opts.OnEvent = link.Send
		reg.MustRegister(link)
	}
	rt, err := router.New(cfg, opts)
	if err != nil {
		return err
	}
	var reloadMu sync.Mutex
	reload := func() error {
		reloadMu.Lock()
		defer reloadMu.Unlock()
		next, err := load()
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

	api := &http.Server{Addr: *listen, Handler: rt, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	servers := []*http.Server{api}
	if *adminListen != "" {
		servers = append(servers, &http.Server{Addr: *adminListen, Handler: rt.AdminHandler(reg, reload, adminToken), ReadHeaderTimeout: 10 * time.Second})
	}
	if *peerListen != "" {
		mux := http.NewServeMux()
		streams := peer.NewHandler(*nodeName, peer.Secret(material), rt, log.With("component", "peers"), nil)
		mux.Handle(peer.Path, streams)
		srv := &http.Server{Addr: *peerListen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		srv.RegisterOnShutdown(streams.Close) // peers' streams last as long as they run
		servers = append(servers, srv)
	}
	// Every address is taken before anything starts: a bad or busy one is
	// then an error and an exit, not a server left running with no way to
	// stop it.
	listeners := make([]net.Listener, 0, len(servers))
	for _, srv := range servers {
		l, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return fmt.Errorf("listen %s: %w", srv.Addr, err)
		}
		listeners = append(listeners, l)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { _ = rt.Run(ctx) })
	if link != nil {
		wg.Go(func() { link.Run(ctx, rt.LoadEvents) })
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := reload(); err != nil {
					log.Error("reload failed; keeping the running configuration", "err", err)
				}
			}
		}
	})
	if *configFile != "" && *configPoll > 0 {
		wg.Go(func() { watchConfigFile(ctx, *configFile, *configPoll, reload, log) })
	}
	errc := make(chan error, len(servers))
	for i, srv := range servers {
		l := listeners[i]
		log.Info("listening", "addr", l.Addr().String())
		if srv == api && onListen != nil {
			onListen(l.Addr())
		}
		wg.Go(func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		})
	}
	stopping := sdnotify.FromEnv(log).Serving(nil) // every address listens
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stopping()
	shutdown, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	for _, srv := range servers {
		_ = srv.Shutdown(shutdown) // lets streams in flight finish
	}
	cancel()
	return err
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
