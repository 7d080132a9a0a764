// Package torrentseed runs a BitTorrent seeder for tests: a real anacrolix
// client on loopback with DHT, trackers, PEX, UPnP and WebTorrent off, so
// nothing leaves the host. A test adds content to it and hands a leecher
// the magnet (its x.pe names the seeder) or the .torrent and the address.
//
// A Corrupt seeder serves bytes with flips in them while claiming every
// piece complete: what a broken or hostile peer does. On puts a seeder on
// another address, inside a netns host of the lab harness say, for daemons
// on other hosts to reach.
package torrentseed

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	g "github.com/anacrolix/generics"
	"github.com/anacrolix/torrent"
	"github.com/anacrolix/torrent/bencode"
	"github.com/anacrolix/torrent/metainfo"
	"github.com/anacrolix/torrent/storage"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// File is one file of a torrent: Path "" with a single file makes a
// single-file torrent.
type File struct {
	Path string
	Data []byte
}

// Seeder is an anacrolix client that seeds what tests add.
type Seeder struct {
	Client *torrent.Client
	dir    string
	// Corrupt flips one byte in every piece it serves (see package doc).
	corrupt bool
	// host is the IP the client listens on; do runs the client's creation
	// (see On).
	host string
	do   func(func() error) error
}

// Option configures a Seeder.
type Option func(*Seeder)

// Corrupt makes a seeder that serves flipped bytes as good ones.
func Corrupt() Option { return func(s *Seeder) { s.corrupt = true } }

// On makes the seeder listen on host (an IP address) and create its
// client inside do, so the client's sockets are made where do runs: a
// netns host's Netns.Do, say. The seeder only accepts connections (no
// DHT, trackers nor PEX give it peers to dial), so no socket is made
// later, outside do.
func On(host string, do func(func() error) error) Option {
	return func(s *Seeder) { s.host, s.do = host, do }
}

// Config is an anacrolix client configuration that stays on loopback: no
// DHT, trackers, PEX, UPnP nor WebTorrent, and a free port.
func Config(dir string) *torrent.ClientConfig {
	cfg := torrent.NewDefaultClientConfig()
	cfg.ListenHost = func(string) string { return "127.0.0.1" }
	cfg.ListenPort = 0
	cfg.NoDHT, cfg.DisableTrackers, cfg.DisablePEX = true, true, true
	cfg.DisableWebtorrent, cfg.NoDefaultPortForwarding = true, true
	cfg.DisableIPv6 = true
	cfg.DisableAcceptRateLimiting = true
	cfg.DataDir = dir
	return cfg
}

// Start starts a seeder, closed when the test ends.
func Start(t testing.TB, opts ...Option) *Seeder {
	t.Helper()
	s := &Seeder{dir: t.TempDir(), host: "127.0.0.1", do: func(f func() error) error { return f() }}
	for _, o := range opts {
		o(s)
	}
	cfg := Config(s.dir)
	cfg.ListenHost = func(string) string { return s.host }
	cfg.Seed = true
	var cl *torrent.Client
	err := s.do(func() (err error) {
		cl, err = torrent.NewClient(cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	s.Client = cl
	return s
}

// Addr is the seeder's TCP peer address.
func (s *Seeder) Addr() string {
	return net.JoinHostPort(s.host, strconv.Itoa(s.Client.LocalPort()))
}

// Build makes the metainfo of files named name in pieces of pieceLength.
func Build(name string, files []File, pieceLength int64) (*metainfo.MetaInfo, error) {
	info := metainfo.Info{Name: name, PieceLength: pieceLength}
	single := len(files) == 1 && files[0].Path == ""
	var all bytes.Buffer
	for _, f := range files {
		all.Write(f.Data)
		if single {
			info.Length = int64(len(f.Data))
			continue
		}
		info.Files = append(info.Files, metainfo.FileInfo{Path: strings.Split(f.Path, "/"), Length: int64(len(f.Data))})
	}
	pieces, err := metainfo.GeneratePieces(&all, pieceLength, nil)
	if err != nil {
		return nil, err
	}
	info.Pieces = pieces
	mi := &metainfo.MetaInfo{}
	if mi.InfoBytes, err = bencodeInfo(info); err != nil {
		return nil, err
	}
	return mi, nil
}

// Add seeds files as torrent name (pieces of pieceLength) and returns its
// metainfo and a magnet whose x.pe names the seeder.
func (s *Seeder) Add(t testing.TB, name string, files []File, pieceLength int64) (*metainfo.MetaInfo, string) {
	t.Helper()
	mi, err := Build(name, files, pieceLength)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(s.dir, mi.HashInfoBytes().HexString())
	for _, f := range files {
		data := f.Data
		if s.corrupt {
			data = bytes.Clone(data)
			for i := 0; i < len(data); i += int(pieceLength) / 2 {
				data[i] ^= 0xff
			}
		}
		p := filepath.Join(root, name, filepath.FromSlash(f.Path))
		if f.Path == "" {
			p = filepath.Join(root, name)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pc := storage.NewMapPieceCompletion()
	if s.corrupt {
		pc = allComplete{}
	}
	st := storage.NewFileOpts(storage.NewFileClientOpts{ClientBaseDir: root, PieceCompletion: pc, UsePartFiles: g.Some(false)})
	spec, err := torrent.TorrentSpecFromMetaInfoErr(mi)
	if err != nil {
		t.Fatal(err)
	}
	spec.Storage = st
	tor, _, err := s.Client.AddTorrentSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	if !s.corrupt {
		if err := tor.VerifyDataContext(t.Context()); err != nil {
			t.Fatal(err)
		}
		wait.For(t, "the seeder to hold torrent "+name+" complete", tor.Complete().Bool)
	}
	return mi, Magnet(mi, s.Addr())
}

// Magnet is mi's magnet link with x.pe peer addresses.
func Magnet(mi *metainfo.MetaInfo, peers ...string) string {
	m := "magnet:?xt=urn:btih:" + mi.HashInfoBytes().HexString()
	for _, p := range peers {
		m += "&x.pe=" + p
	}
	return m
}

// Write writes mi as a .torrent file.
func Write(t testing.TB, mi *metainfo.MetaInfo, path string) {
	t.Helper()
	var buf bytes.Buffer
	if err := mi.Write(&buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Fetch downloads the torrent mi names with a fresh anacrolix client on
// loopback (web seeds allowed, peers as given) and returns its bytes in
// torrent order.
func Fetch(t testing.TB, mi *metainfo.MetaInfo, peers ...string) []byte {
	t.Helper()
	cfg := Config(t.TempDir())
	cfg.DisableWebseeds = false
	cl, err := torrent.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tor, err := cl.AddTorrent(mi)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peers {
		addr, err := net.ResolveTCPAddr("tcp", p)
		if err != nil {
			t.Fatal(err)
		}
		tor.AddPeers([]torrent.PeerInfo{{Addr: addr, Trusted: true}})
	}
	r := tor.NewReader()
	defer r.Close()
	r.SetContext(t.Context())
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// allComplete says every piece is complete, whatever is on disk.
type allComplete struct{}

func (allComplete) Get(metainfo.PieceKey) (storage.Completion, error) {
	return storage.Completion{Complete: true, Ok: true}, nil
}
func (allComplete) Set(metainfo.PieceKey, bool) error { return nil }
func (allComplete) Close() error                      { return nil }

func bencodeInfo(info metainfo.Info) ([]byte, error) {
	return bencode.Marshal(info)
}
