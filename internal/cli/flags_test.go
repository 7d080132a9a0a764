package cli

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestParseConfig(t *testing.T) {
	got, err := parseConfig([]byte("data-dir: /nvme\nlabel:\n  - gpu=h100\n  - zone=a\nreserve: 10GiB\nresync-interval: 5m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got["data-dir"] != "/nvme" || got["label"] != "gpu=h100,zone=a" || got["reserve"] != "10GiB" {
		t.Fatalf("parseConfig = %v", got)
	}
	for _, bad := range []string{"a: {b: c}", "x: [{a: b}]", "- list", ": :"} {
		if _, err := parseConfig([]byte(bad)); err == nil {
			t.Errorf("parseConfig(%q) accepted", bad)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("data-dir: /x\nlabel: [a=b]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseConfig(data)
	})
}

func TestFlagLayers(t *testing.T) {
	newFS := func() (*pflag.FlagSet, *string, *listFlag) {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		fs.SetOutput(&bytes.Buffer{})
		dir := fs.String("data-dir", "default", "")
		var labels listFlag
		fs.Var(&labels, "label", "")
		return fs, dir, &labels
	}
	env := func(m map[string]string) *Env {
		return &Env{Getenv: func(k string) string { return m[k] }, Stderr: &bytes.Buffer{}}
	}
	file := map[string]string{"data-dir": "from-file", "label": "a=1,b=2"}

	fs, dir, labels := newFS()
	if err := parseFlags(fs, env(nil), nil, file); err != nil || *dir != "from-file" || labels.String() != "a=1,b=2" {
		t.Fatalf("file layer: %q %v %v", *dir, labels, err)
	}
	fs, dir, _ = newFS()
	if err := parseFlags(fs, env(map[string]string{"WARMFLEET_DATA_DIR": "from-env"}), nil, file); err != nil || *dir != "from-env" {
		t.Fatalf("env layer: %q %v", *dir, err)
	}
	fs, dir, _ = newFS()
	if err := parseFlags(fs, env(map[string]string{"WARMFLEET_DATA_DIR": "from-env"}), []string{"--data-dir", "from-flag"}, file); err != nil || *dir != "from-flag" {
		t.Fatalf("flag layer: %q %v", *dir, err)
	}
	fs, _, _ = newFS()
	if err := parseFlags(fs, env(nil), nil, map[string]string{"data-dri": "typo"}); err == nil || !strings.Contains(err.Error(), "data-dri") {
		t.Fatalf("unknown config key accepted: %v", err)
	}
}

func TestRunUsage(t *testing.T) {
	var stderr bytes.Buffer
	e := &Env{Stdout: &bytes.Buffer{}, Stderr: &stderr, Getenv: func(string) string { return "" }}
	tests := []struct {
		args []string
		code int
		msg  string
	}{
		{nil, 2, "usage"},
		{[]string{"nope"}, 2, "unknown command"},
		{[]string{"cache"}, 2, "needs a subcommand"},
		{[]string{"cache", "add", "m", "--source", "http://x"}, 2, "s3://"},
		{[]string{"cache", "add", "--source", "s3://bkt/p/"}, 2, "NAME"},
		{[]string{"cache", "status", "m", "--api", "ftp://x"}, 2, "api address"},
		{[]string{"image", "add", "--owner", "web"}, 2, "give the image REF"},
		{[]string{"image", "rm"}, 2, "give the image REF"},
		{[]string{"cache", "add", "m", "--source", "s3://bkt/p/", "--wait", "--timeout", "-5s", "--api", "unix:///nonexistent/x.sock"}, 2, "--timeout"},
		{[]string{"cache", "ls", "-o", "xml", "--api", "unix:///nonexistent.sock"}, 2, `-o "xml": want table, json or yaml`},
		{[]string{"cache", "ls", "--api", "unix:///nonexistent/x.sock"}, 1, "daemon at unix:///nonexistent/x.sock"},
		{[]string{"image", "ls", "--api", "unix:///nonexistent/x.sock"}, 1, "is the daemon running? Start it with 'warmfleet daemon', or point --api"},
		{[]string{"daemon", "--api", "0.0.0.0:1", "--data-dir", "/nonexistent-warmfleet-test"}, 2, "bearer token"},
		{[]string{"daemon", "--log-level", "loud"}, 2, "log-level"},
		{[]string{"daemon", "--reserve", "lots"}, 2, "size"},
		{[]string{"daemon", "--old-revision-grace", "-1m"}, 2, "--old-revision-grace -1m0s: want a duration >= 0"},
		{[]string{"daemon", "--old-revision-grace", "NaN"}, 2, `invalid argument "NaN" for "--old-revision-grace"`},
		{[]string{"daemon", "--old-revision-grace", "10"}, 2, `invalid argument "10" for "--old-revision-grace"`},
		{[]string{"daemon", "--old-revision-grace", "0", "--api", "0.0.0.0:1", "--data-dir", "/nonexistent-warmfleet-test"}, 2, "reachable from other hosts"},
		{[]string{"router", "--backend", "http://127.0.0.1:1", "--peer", "http://127.0.0.1:2"}, 2, "--peer and --peer-listen need --cluster-key-file or --hash-key-file"},
		{[]string{"router", "--backend", "http://127.0.0.1:1", "--peer-listen", "127.0.0.1:0"}, 2, "--peer and --peer-listen need"},
		{[]string{"router", "--backend", "http://127.0.0.1:1", "--peer", "ftp://x"}, 2, "ftp://x"},
		{[]string{"router", "--backend", "http://127.0.0.1:1", "--kv-events", "http://127.0.0.1:1"}, 2, "want BACKEND_URL=tcp://HOST:PORT"},
		{[]string{"router", "--backend", "http://127.0.0.1:1", "--kv-events", "http://127.0.0.1:1=udp://x:1"}, 2, "http://127.0.0.1:1: \"udp://x:1\": want tcp://HOST:PORT"},
		{[]string{"router", "--backend", "http://127.0.0.1:1", "--kv-events", "http://127.0.0.1:2=tcp://127.0.0.1:5557"}, 2, "--kv-events http://127.0.0.1:2: not a configured backend"},
		{[]string{"router", "--backend", "http://127.0.0.1:1", "--kv-events", "http://127.0.0.1:1=tcp://h:1", "--kv-events", "http://127.0.0.1:1/=tcp://h:2"}, 2, "given twice"},
		{[]string{"version"}, 0, ""},
	}
	for _, tt := range tests {
		stderr.Reset()
		code := Run(t.Context(), tt.args, e)
		if code != tt.code || !strings.Contains(stderr.String(), tt.msg) {
			t.Errorf("Run(%q) = %d, stderr %q; want %d containing %q", tt.args, code, stderr.String(), tt.code, tt.msg)
		}
	}
}

// TestPeerAdvertise: the peer address gossip tells members to dial. A
// --p2p port of 0 is the port the listener bound, not 0: members dialled
// port 0 and nothing swarmed (the demo's daemons on loopback).
func TestPeerAdvertise(t *testing.T) {
	bound := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 41234}
	for _, tc := range []struct {
		p2p, advertise, gossip, p2pAdvertise string
		want                                 string
	}{
		{p2p: "127.0.0.1:0", gossip: "127.0.0.1:7946", want: "127.0.0.1:41234"},
		{p2p: "10.0.0.1:7947", gossip: "10.0.0.1:7946", want: "10.0.0.1:7947"},
		{p2p: ":7947", gossip: "10.0.0.1:7946", want: "10.0.0.1:7947"},
		{p2p: "0.0.0.0:0", gossip: "0.0.0.0:7946", advertise: "10.0.0.2:7946", want: "10.0.0.2:41234"},
		{p2p: "127.0.0.1:0", p2pAdvertise: "node-1.example:7947", want: "node-1.example:7947"},
	} {
		f := &daemonFlags{p2pAddr: tc.p2p, advertise: tc.advertise, gossipAddr: tc.gossip, p2pAdvertise: tc.p2pAdvertise}
		if got := peerAdvertise(f, bound); got != tc.want {
			t.Errorf("--p2p %s --advertise %q --gossip %s --p2p-advertise %q: %s, want %s", tc.p2p, tc.advertise, tc.gossip, tc.p2pAdvertise, got, tc.want)
		}
	}
}
