// Package torrentorigin fetches a model's files from a BitTorrent swarm
// through github.com/anacrolix/torrent: the origin of magnet links and
// .torrent files (spec.TorrentSource).
//
// # What the fleet does with it
//
// A torrent is an origin like S3: the daemon lists it on every node (a
// magnet's metadata, a few hundred KB at most, comes from the peers the
// node can reach; a .torrent file is read from its URL, S3 object or
// path), and each shard's origin node reads the shard's bytes here, once
// for the fleet; the other nodes take them from the fleet's own swarm.
// The revision is pinned to the info hash: every listed object carries it
// as its VersionID (cache status shows it as the commit), so another
// .torrent at the same URL is a new revision, never a mix.
//
// # Trust
//
// Every byte handed out comes through anacrolix's non-responsive reader,
// which returns only pieces whose SHA-1 matched the torrent's; a piece a
// peer corrupted is fetched again (and the peer banned), never returned.
// Verify hashes a local copy again piece by piece (pieces shared with a
// neighbouring file are checked when this node holds the neighbour's bytes,
// else reported unchecked). Names must be safe relative paths and the
// metadata is read through size limits (MaxMetainfo, MaxFiles).
//
// # What reaches the internet
//
// Nothing the operator did not allow. DHT, trackers, PEX and web seeds
// are off unless Options say otherwise; without them a magnet's peers are
// its x.pe addresses and the Options.Peers. Upload is off: seeding back to
// the public swarm is Options.Seed, within a ratio and a time limit. UPnP
// port mapping and WebTorrent are always off.
//
// # Disk
//
// anacrolix keeps a torrent's data under Dir/data/<info hash> while it is
// read (the daemon copies it into the cache), so an origin node holds a
// shard twice for a while: a torrent no reader used for IdleDrop, and
// done seeding, is dropped and its data deleted. Its metadata stays in
// Dir/meta, so a resync or a verify needs no network.
package torrentorigin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/anacrolix/torrent"
	"github.com/anacrolix/torrent/metainfo"
	"github.com/anacrolix/torrent/storage"
	"golang.org/x/time/rate"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// Defaults for Options.
const (
	DefaultMetadataTimeout = 2 * time.Minute
	DefaultStallTimeout    = 2 * time.Minute
	DefaultIdleDrop        = 10 * time.Minute
	DefaultSeedRatio       = 1.0
	DefaultSeedTime        = time.Hour
	DefaultListen          = ":0"
)

// Options tune an Origin. The zero value (with Dir set) fetches from the
// peers a magnet names only, uploads nothing, and listens on a free port.
type Options struct {
	// Dir holds the torrents' data and metadata (required).
	Dir string
	// Listen is the peer listener's host:port (default ":0", a free
	// port on every interface).
	Listen string
	// DHT, Trackers, PEX and WebSeeds let anacrolix find peers (and
	// HTTP seeds) beyond a magnet's x.pe and Peers.
	DHT, Trackers, PEX, WebSeeds bool
	// Peers are host:port peers added to every torrent (a site's own
	// seeder, say).
	Peers []string
	// Seed uploads to the public swarm, while a torrent was not read for
	// IdleDrop, until it uploaded SeedRatio times its size or SeedTime
	// passed since it was added; off, nothing is uploaded.
	Seed      bool
	SeedRatio float64
	SeedTime  time.Duration
	// DownloadLimit and UploadLimit are bytes per second (0: no limit).
	DownloadLimit, UploadLimit int64
	// MetadataTimeout bounds the wait for a magnet's metadata;
	// StallTimeout how long a read waits for a piece (default 2 minutes).
	MetadataTimeout, StallTimeout time.Duration
	// IdleDrop is how long a torrent nobody reads stays loaded.
	IdleDrop time.Duration
	// PartSize and Concurrency mean what they mean in s3origin.Options.
	PartSize    int64
	Concurrency int
	// S3 reads torrent+s3:// sources (nil: those fail).
	S3 origin.Origin
	// HTTP fetches torrent+http(s):// sources (nil: a client with a
	// one minute timeout).
	HTTP   *http.Client
	Logger *slog.Logger
	// OnBytes is called with the size of every chunk handed to a
	// reader (the daemon's origin-bytes metric).
	OnBytes func(n int)
	// Clock is the time source (nil: time.Now).
	Clock func() time.Time
}

func (o Options) withDefaults() (Options, error) {
	if o.Dir == "" {
		return o, errors.New("torrent dir: required")
	}
	o.Listen = cmp.Or(o.Listen, DefaultListen)
	if _, port, err := net.SplitHostPort(o.Listen); err != nil {
		return o, fmt.Errorf("torrent listen %q: want host:port", o.Listen)
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return o, fmt.Errorf("torrent listen %q: port: want 0..65535", o.Listen)
	}
	for _, p := range o.Peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return o, fmt.Errorf("torrent peer %q: want host:port", p)
		}
	}
	if o.SeedRatio < 0 || o.SeedTime < 0 || o.DownloadLimit < 0 || o.UploadLimit < 0 {
		return o, errors.New("torrent seed ratio, seed time and rate limits: want >= 0")
	}
	o.SeedRatio = cmp.Or(o.SeedRatio, DefaultSeedRatio)
	o.SeedTime = cmp.Or(o.SeedTime, DefaultSeedTime)
	o.MetadataTimeout = cmp.Or(max(o.MetadataTimeout, 0), DefaultMetadataTimeout)
	o.StallTimeout = cmp.Or(max(o.StallTimeout, 0), DefaultStallTimeout)
	o.IdleDrop = cmp.Or(max(o.IdleDrop, 0), DefaultIdleDrop)
	o.PartSize = cmp.Or(o.PartSize, s3origin.DefaultPartSize)
	o.Concurrency = cmp.Or(o.Concurrency, s3origin.DefaultConcurrency)
	if o.PartSize < 1 || o.Concurrency < 1 {
		return o, errors.New("torrent part size and concurrency: want >= 1")
	}
	if o.HTTP == nil {
		o.HTTP = &http.Client{Timeout: time.Minute}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.OnBytes == nil {
		o.OnBytes = func(int) {}
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return o, nil
}

// Origin reads magnet: and torrent+...:// sources. Its anacrolix client
// starts with the first torrent, so a node that never lists one opens no
// port.
type Origin struct {
	opts Options

	mu       sync.Mutex
	cl       *torrent.Client
	closed   bool
	torrents map[string]*entry // by info hash
	// janitor stops the goroutine that drops idle torrents.
	stopJanitor chan struct{}
	janitorDone chan struct{}
}

// entry is a torrent the client holds.
type entry struct {
	l      *layout
	t      *torrent.Torrent
	added  time.Time
	active int       // readers open
	used   time.Time // when the last reader closed
}

var _ origin.Origin = (*Origin)(nil)

// New makes an Origin; its client starts, and Dir is made, on first use.
func New(opts Options) (*Origin, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Origin{opts: opts, torrents: map[string]*entry{}}, nil
}

// Close stops the client (dropping every torrent; their data stays on
// disk for the next run to check and reuse).
func (o *Origin) Close() error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil
	}
	o.closed = true
	cl := o.cl
	stop, done := o.stopJanitor, o.janitorDone
	o.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	if cl == nil {
		return nil
	}
	return errors.Join(cl.Close()...)
}

// ListenAddrs are the peer listener's addresses (none before first use).
func (o *Origin) ListenAddrs() []net.Addr {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cl == nil {
		return nil
	}
	return o.cl.ListenAddrs()
}

// client returns the anacrolix client, starting it. With o.mu held.
func (o *Origin) client() (*torrent.Client, error) {
	if o.closed {
		return nil, errors.New("torrent origin closed")
	}
	if o.cl != nil {
		return o.cl, nil
	}
	for _, d := range []string{"meta", "data"} {
		if err := os.MkdirAll(filepath.Join(o.opts.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("torrent dir: %w", err)
		}
	}
	cl, err := torrent.NewClient(o.config())
	if err != nil {
		return nil, fmt.Errorf("start the torrent client on %s: %w", o.opts.Listen, err)
	}
	o.cl = cl
	o.stopJanitor, o.janitorDone = make(chan struct{}), make(chan struct{})
	go o.janitor(o.stopJanitor, o.janitorDone)
	return cl, nil
}

// config is the anacrolix configuration Options ask for.
func (o *Origin) config() *torrent.ClientConfig {
	opts := o.opts
	cfg := torrent.NewDefaultClientConfig()
	host, port, _ := net.SplitHostPort(opts.Listen)
	cfg.ListenHost = func(string) string { return host }
	cfg.ListenPort, _ = strconv.Atoi(port)
	// An address of one family listens on that family only.
	if ip := net.ParseIP(host); ip != nil {
		cfg.DisableIPv6 = ip.To4() != nil
		cfg.DisableIPv4 = ip.To4() == nil
	}
	cfg.NoDHT, cfg.DisableTrackers, cfg.DisablePEX = !opts.DHT, !opts.Trackers, !opts.PEX
	cfg.DisableWebseeds, cfg.DisableWebtorrent, cfg.NoDefaultPortForwarding = !opts.WebSeeds, true, true
	cfg.Seed, cfg.NoUpload = opts.Seed, !opts.Seed
	cfg.DataDir = filepath.Join(opts.Dir, "data")
	// Completion is kept in memory only: a restarted node hashes what is on
	// disk again rather than trust a record of it.
	cfg.DefaultStorage = storage.NewFileOpts(storage.NewFileClientOpts{
		ClientBaseDir:   cfg.DataDir,
		PieceCompletion: storage.NewMapPieceCompletion(),
		TorrentDirMaker: func(base string, _ *metainfo.Info, ih metainfo.Hash) string {
			return filepath.Join(base, ih.HexString())
		},
	})
	if opts.DownloadLimit > 0 {
		cfg.DownloadRateLimiter = rate.NewLimiter(rate.Limit(opts.DownloadLimit), 0)
	}
	if opts.UploadLimit > 0 {
		cfg.UploadRateLimiter = rate.NewLimiter(rate.Limit(opts.UploadLimit), int(max(opts.UploadLimit, 256<<10)))
	}
	cfg.Slogger = opts.Logger
	return cfg
}

// List returns the files of the torrent source names, pinned to its info
// hash.
func (o *Origin) List(ctx context.Context, source string) ([]origin.Object, error) {
	l, err := o.resolve(ctx, source)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", source, err)
	}
	objs := l.objects()
	if len(objs) == 0 {
		return nil, fmt.Errorf("list %s: %w: only padding files", source, origin.ErrEmpty)
	}
	return objs, nil
}

// resolve reads source's metadata: a .torrent from where it is, a
// magnet's from disk if this node listed it before, else from its peers.
// The torrent is then loaded in the client.
func (o *Origin) resolve(ctx context.Context, source string) (*layout, error) {
	src, err := spec.ParseTorrentSource(source)
	if err != nil {
		return nil, err
	}
	if !src.Magnet {
		mi, err := o.readTorrentFile(ctx, src.File)
		if err != nil {
			return nil, err
		}
		l, err := parseInfo(mi.InfoBytes)
		if err != nil {
			return nil, err
		}
		var trackers []string
		for _, tier := range mi.UpvertedAnnounceList() {
			trackers = append(trackers, tier...)
		}
		if _, err := o.load(l, trackers, mi.UrlList, nil); err != nil {
			return nil, err
		}
		return l, nil
	}
	if e, err := o.loaded(src.InfoHash); err != nil || e != nil {
		if e != nil {
			o.addPeers(e.t, src.Peers)
			return e.l, nil
		}
		return nil, err
	}
	return o.fetchMetadata(ctx, src)
}

// fetchMetadata adds a magnet to the client and waits for its info from
// peers.
func (o *Origin) fetchMetadata(ctx context.Context, src spec.TorrentSource) (*layout, error) {
	var ih metainfo.Hash
	if err := ih.FromHexString(src.InfoHash); err != nil {
		return nil, err
	}
	o.mu.Lock()
	cl, err := o.client()
	if err != nil {
		o.mu.Unlock()
		return nil, err
	}
	ts := &torrent.TorrentSpec{AddTorrentOpts: torrent.AddTorrentOpts{InfoHash: ih}}
	if o.opts.Trackers {
		ts.Trackers = [][]string{src.Trackers}
	}
	t, _, err := cl.AddTorrentSpec(ts)
	o.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("add magnet: %w", err)
	}
	o.addPeers(t, src.Peers)
	timer := time.NewTimer(o.opts.MetadataTimeout)
	defer timer.Stop()
	select {
	case <-t.GotInfo():
	case <-ctx.Done():
		o.dropIfUnused(src.InfoHash, t)
		return nil, context.Cause(ctx)
	case <-timer.C:
		o.dropIfUnused(src.InfoHash, t)
		return nil, fmt.Errorf("%w: no peer sent the torrent's metadata in %v (%s)", origin.ErrUnreachable, o.opts.MetadataTimeout, o.findsPeers(src))
	}
	l, err := parseInfo(t.Metainfo().InfoBytes)
	if err != nil {
		t.Drop()
		return nil, err
	}
	meta, err := encodeMeta(l.infoBytes)
	if err == nil {
		err = writeFileAtomic(o.metaPath(l.infoHash), meta)
	}
	if err != nil {
		return nil, fmt.Errorf("keep the torrent's metadata: %w", err)
	}
	if _, err := o.load(l, src.Trackers, nil, t); err != nil {
		return nil, err
	}
	return l, nil
}

// findsPeers says how this origin may find a magnet's peers, for errors.
func (o *Origin) findsPeers(src spec.TorrentSource) string {
	return fmt.Sprintf("%d x.pe peers, %d --torrent-peer peers, DHT %s, trackers %s, PEX %s",
		len(src.Peers), len(o.opts.Peers), onOff(o.opts.DHT), onOff(o.opts.Trackers), onOff(o.opts.PEX))
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// dropIfUnused drops a torrent added only to fetch its metadata.
func (o *Origin) dropIfUnused(ih string, t *torrent.Torrent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.torrents[ih] == nil {
		t.Drop()
	}
}

// loaded returns the entry of a torrent loaded here, loading it from its
// kept metadata when this node listed it before; nil when it never did.
func (o *Origin) loaded(ih string) (*entry, error) {
	o.mu.Lock()
	e := o.torrents[ih]
	o.mu.Unlock()
	if e != nil {
		return e, nil
	}
	f, err := os.Open(o.metaPath(ih))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mi, err := ParseMetainfo(f)
	if err != nil {
		return nil, fmt.Errorf("kept metadata of %s: %w", ih, err)
	}
	l, err := parseInfo(mi.InfoBytes)
	if err != nil || l.infoHash != ih {
		return nil, fmt.Errorf("kept metadata of %s: does not match it (%v)", ih, err)
	}
	return o.load(l, nil, nil, nil)
}

// load puts a torrent with known info in the client (t, if not nil, is
// the torrent already added for its metadata) and registers it.
func (o *Origin) load(l *layout, trackers, webSeeds []string, t *torrent.Torrent) (*entry, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e := o.torrents[l.infoHash]; e != nil {
		return e, nil
	}
	cl, err := o.client()
	if err != nil {
		return nil, err
	}
	if t == nil {
		var ih metainfo.Hash
		_ = ih.FromHexString(l.infoHash)
		ts := &torrent.TorrentSpec{AddTorrentOpts: torrent.AddTorrentOpts{InfoHash: ih, InfoBytes: l.infoBytes}}
		if o.opts.Trackers && len(trackers) > 0 {
			ts.Trackers = [][]string{trackers}
		}
		if o.opts.WebSeeds {
			ts.Webseeds = webSeeds
		}
		if t, _, err = cl.AddTorrentSpec(ts); err != nil {
			return nil, fmt.Errorf("add torrent %s: %w", l.infoHash, err)
		}
	}
	o.addPeersLocked(t, nil)
	if _, err := os.Stat(o.metaPath(l.infoHash)); errors.Is(err, os.ErrNotExist) {
		if meta, err := encodeMeta(l.infoBytes); err == nil {
			if err := writeFileAtomic(o.metaPath(l.infoHash), meta); err != nil {
				o.opts.Logger.Warn("keep torrent metadata", "infohash", l.infoHash, "err", err)
			}
		}
	}
	now := o.opts.Clock()
	e := &entry{l: l, t: t, added: now, used: now}
	o.torrents[l.infoHash] = e
	return e, nil
}

func (o *Origin) addPeers(t *torrent.Torrent, extra []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.addPeersLocked(t, extra)
}

// addPeersLocked adds Options.Peers and extra to t. None is trusted: a
// peer that alone sent a piece failing its hash is banned by IP for the
// client's life, as any swarm peer would be. Trusted, a corrupting seeder
// was asked for the same bad pieces again and again, at line rate, until
// the stall timeout.
func (o *Origin) addPeersLocked(t *torrent.Torrent, extra []string) {
	var peers []torrent.PeerInfo
	for _, p := range append(append([]string(nil), o.opts.Peers...), extra...) {
		addr, err := net.ResolveTCPAddr("tcp", p)
		if err != nil {
			o.opts.Logger.Warn("torrent peer address", "peer", p, "err", err)
			continue
		}
		peers = append(peers, torrent.PeerInfo{Addr: addr, Source: torrent.PeerSourceDirect})
	}
	if len(peers) > 0 {
		t.AddPeers(peers)
	}
}

func (o *Origin) metaPath(ih string) string {
	return filepath.Join(o.opts.Dir, "meta", ih+".torrent")
}

func (o *Origin) dataPath(ih string) string {
	return filepath.Join(o.opts.Dir, "data", ih)
}

// writeFileAtomic writes b to name through a temporary file.
func writeFileAtomic(name string, b []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}
