package cli

import (
	"path/filepath"
	"time"

	"github.com/warmfleet/warmfleet/internal/torrentorigin"
)

// torrentFlags are the daemon's settings for magnet: and torrent+...://
// sources. Everything that reaches beyond the peers a source names is off
// unless the operator turns it on.
type torrentFlags struct {
	dir                          string
	listen                       string
	dht, trackers, pex, webSeeds bool
	peers                        listFlag
	seed                         bool
	seedRatio                    float64
	seedTime                     time.Duration
	download, upload             byteSize
	metadataTimeout, stall, idle time.Duration
}

func (t *torrentFlags) register(fs *flagSet) {
	fs.StringVar(&t.dir, "torrent-dir", "", "where BitTorrent sources' data is kept while it is read, and their metadata (default DATA-DIR/torrent)")
	fs.StringVar(&t.listen, "torrent-listen", torrentorigin.DefaultListen, "BitTorrent peer listener host:port (port 0: a free one); opened with the first torrent source")
	fs.BoolVar(&t.dht, "torrent-dht", false, "find BitTorrent peers through the public DHT")
	fs.BoolVar(&t.trackers, "torrent-trackers", false, "announce to the trackers a magnet or .torrent names")
	fs.BoolVar(&t.pex, "torrent-pex", false, "exchange peers with peers (PEX)")
	fs.BoolVar(&t.webSeeds, "torrent-web-seeds", false, "fetch from the HTTP web seeds a .torrent names")
	fs.Var(&t.peers, "torrent-peer", "BitTorrent peer host:port added to every torrent, e.g. a site's own seeder (repeatable or comma-separated)")
	fs.BoolVar(&t.seed, "torrent-seed", false, "upload to the public swarm (off: nothing is uploaded), until --torrent-seed-ratio or --torrent-seed-time is reached")
	fs.Float64Var(&t.seedRatio, "torrent-seed-ratio", torrentorigin.DefaultSeedRatio, "with --torrent-seed, stop once a torrent uploaded this many times its size")
	fs.DurationVar(&t.seedTime, "torrent-seed-time", torrentorigin.DefaultSeedTime, "with --torrent-seed, stop this long after a torrent was loaded")
	fs.Var(&t.download, "torrent-download-limit", "bytes per second taken from BitTorrent peers, e.g. 100MiB (0 = unlimited)")
	fs.Var(&t.upload, "torrent-upload-limit", "bytes per second given to BitTorrent peers when seeding (0 = unlimited)")
	fs.DurationVar(&t.metadataTimeout, "torrent-metadata-timeout", torrentorigin.DefaultMetadataTimeout, "how long a magnet waits for its metadata from peers")
	fs.DurationVar(&t.stall, "torrent-stall-timeout", torrentorigin.DefaultStallTimeout, "how long a read waits for a verified piece before it fails")
	fs.DurationVar(&t.idle, "torrent-idle-drop", torrentorigin.DefaultIdleDrop, "a torrent nobody read for this long (and done seeding) is dropped and its data deleted")
}

// options are the torrent origin's settings; dataDir is the daemon's.
func (t *torrentFlags) options(dataDir string) torrentorigin.Options {
	dir := t.dir
	if dir == "" {
		dir = filepath.Join(dataDir, "torrent")
	}
	return torrentorigin.Options{
		Dir: dir, Listen: t.listen, DHT: t.dht, Trackers: t.trackers, PEX: t.pex, WebSeeds: t.webSeeds,
		Peers: t.peers, Seed: t.seed, SeedRatio: t.seedRatio, SeedTime: t.seedTime,
		DownloadLimit: int64(t.download), UploadLimit: int64(t.upload),
		MetadataTimeout: t.metadataTimeout, StallTimeout: t.stall, IdleDrop: t.idle,
	}
}
