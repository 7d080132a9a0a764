package cli

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/warmfleet/warmfleet/gossip"
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

// TestP2PEncryptFlag: --p2p-encrypt reaches the swarm, whose peer port then
// speaks mutual TLS only: a member dialing with TLS is admitted (asked for
// an unknown shard, it is told so), one dialing without is refused, and the
// other way round without the flag.
func TestP2PEncryptFlag(t *testing.T) {
	key, keyFile := clusterKeyFile(t)
	for _, encrypt := range []bool{true, false} {
		fs := newFlagSet(&Env{Stderr: io.Discard}, "daemon")
		var f daemonFlags
		f.register(fs)
		args := []string{"--node-name", "server", "--gossip", "127.0.0.1:0", "--cluster-key-file", keyFile, "--p2p", "127.0.0.1:0"}
		if encrypt {
			args = append(args, "--p2p-encrypt")
		}
		if err := parseFlags(fs, &Env{Stderr: io.Discard, Getenv: noEnv}, args, nil); err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		ln, node, err := startSwarm(ctx, slog.New(slog.DiscardHandler), &f, new(atomic.Pointer[gossip.Node]))
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
			_, err = client.FetchManifest(ctx, ln.Addr().String(), "no-such-shard")
			if admitted := errors.Is(err, p2p.ErrNoManifest); admitted != (clientTLS == encrypt) {
				t.Errorf("server --p2p-encrypt=%v, client TLS %v: FetchManifest err = %v; want admitted only when they agree", encrypt, clientTLS, err)
			}
		}
		_ = ln.Close()
		<-served //nolint:errcheck // Serve's error after its listener closed says only that
	}
}
