package cli

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/p2p"
)

// clusterKeyFile writes a fresh cluster key to a file for --cluster-key-file.
func clusterKeyFile(t *testing.T) (key []byte, path string) {
	t.Helper()
	key, err := gossip.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(path, []byte(gossip.EncodeKey(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return key, path
}

// pinnedFleet is a fleet as the swarm sees it: no keyring of its own, and
// the identity keys gossip would have pinned to member names. The swarm
// reads it from its connections' goroutines while the test pins.
type pinnedFleet struct {
	mu   sync.Mutex
	keys map[string][]byte
}

func (*pinnedFleet) Keys() [][]byte { return nil }

func (p *pinnedFleet) PeerKey(name string) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.keys[name]
}

func (p *pinnedFleet) pin(name string, key []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys == nil {
		p.keys = map[string][]byte{}
	}
	p.keys[name] = key
}

// TestP2PEncryptFlag: peer connections are encrypted by default, and the
// peer port then speaks TLS only: a member dialing with TLS is
// admitted (asked for an unknown shard, it is told so), one dialing without
// is refused, and the other way round with --p2p-encrypt=false.
func TestP2PEncryptFlag(t *testing.T) {
	key, keyFile := clusterKeyFile(t)
	for _, encrypt := range []bool{true, false} {
		args := []string{"--node-name", "server", "--gossip", "127.0.0.1:0", "--cluster-key-file", keyFile, "--p2p", "127.0.0.1:0", "--data-dir", t.TempDir()}
		if !encrypt {
			args = append(args, "--p2p-encrypt=false")
		}
		f := parseDaemonFlags(t, args)
		fleet := &pinnedFleet{}
		ctx := t.Context()
		ln, node, err := startSwarm(ctx, slog.New(slog.DiscardHandler), f, func() swarmFleet { return fleet })
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- node.Serve(ctx, ln) }()
		for _, clientTLS := range []bool{true, false} {
			client, err := p2p.NewNode(p2p.Config{NodeID: "client", ClusterKey: key, Encrypt: clientTLS})
			if err != nil {
				t.Fatal(err)
			}
			fleet.pin("client", client.PublicKey())
			_, err = client.FetchManifest(ctx, ln.Addr().String(), "no-such-shard")
			if admitted := errors.Is(err, p2p.ErrNoManifest); admitted != (clientTLS == encrypt) {
				t.Errorf("server --p2p-encrypt=%v, client TLS %v: FetchManifest err = %v; want admitted only when they agree", encrypt, clientTLS, err)
			}
		}
		_ = ln.Close()
		<-served //nolint:errcheck // Serve's error after its listener closed says only that
	}
}

func parseDaemonFlags(t *testing.T, args []string) *daemonFlags {
	t.Helper()
	fs := newFlagSet(&Env{Stderr: io.Discard}, "daemon")
	var f daemonFlags
	f.register(fs)
	if err := parseFlags(fs, &Env{Stderr: io.Discard, Getenv: noEnv}, args, nil); err != nil {
		t.Fatal(err)
	}
	return &f
}

// TestSwarmIdentity: the swarm's identity key is made in the data
// directory on first start and kept across restarts, and the peer port
// admits a member only under the name its key is pinned to by the fleet.
func TestSwarmIdentity(t *testing.T) {
	key, keyFile := clusterKeyFile(t)
	dataDir := t.TempDir()
	f := parseDaemonFlags(t, []string{"--node-name", "server", "--gossip", "127.0.0.1:0", "--cluster-key-file", keyFile, "--p2p", "127.0.0.1:0", "--data-dir", dataDir})
	fleet := &pinnedFleet{}
	start := func() (net.Listener, *p2p.Node) {
		ln, node, err := startSwarm(t.Context(), slog.New(slog.DiscardHandler), f, func() swarmFleet { return fleet })
		if err != nil {
			t.Fatal(err)
		}
		return ln, node
	}
	ln, node := start()
	ln.Close()
	st, err := os.Stat(filepath.Join(dataDir, p2p.IdentityFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("identity file: %v, mode %v", err, st.Mode())
	}
	ln, again := start()
	if !again.PublicKey().Equal(node.PublicKey()) {
		t.Fatal("the identity key changed across a restart")
	}
	ctx := t.Context()
	served := make(chan error, 1)
	go func() { served <- again.Serve(ctx, ln) }()
	member, err := p2p.NewNode(p2p.Config{NodeID: "member", ClusterKey: key, Encrypt: true})
	if err != nil {
		t.Fatal(err)
	}
	impostor, err := p2p.NewNode(p2p.Config{NodeID: "member", ClusterKey: key, Encrypt: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := member.FetchManifest(ctx, ln.Addr().String(), "x"); !errors.Is(err, p2p.ErrUnauthenticated) {
		t.Fatalf("a member the fleet has no key for: err = %v", err)
	}
	fleet.pin("member", member.PublicKey())
	if _, err := member.FetchManifest(ctx, ln.Addr().String(), "x"); !errors.Is(err, p2p.ErrNoManifest) {
		t.Fatalf("the member: err = %v", err)
	}
	if _, err := impostor.FetchManifest(ctx, ln.Addr().String(), "x"); err == nil || errors.Is(err, p2p.ErrNoManifest) {
		t.Fatalf("a member under another's name: err = %v", err)
	}
	wait.For(t, "the impostor counted", func() bool { return again.Stats().IdentityRefusals == 1 })
	_ = ln.Close()
	<-served //nolint:errcheck // Serve's error after its listener closed says only that
	if err := os.WriteFile(filepath.Join(dataDir, p2p.IdentityFile), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := startSwarm(ctx, slog.New(slog.DiscardHandler), f, func() swarmFleet { return fleet }); err == nil || !strings.Contains(err.Error(), p2p.IdentityFile) {
		t.Fatalf("corrupt identity file: err = %v", err)
	}
}
