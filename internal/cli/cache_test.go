package cli

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/hubserver"
	"github.com/warmfleet/warmfleet/internal/testutil/syncbuf"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// syncBuffer is the shared test buffer under the name this package's tests use.
type syncBuffer = syncbuf.Buffer

// TestDaemonAndCacheCommands runs `warmfleet daemon` and the cache client
// commands in-process against a real S3 server, over a unix socket.
func TestDaemonAndCacheCommands(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	weights := bytes.Repeat([]byte("warmfleet"), 300_000)
	s3.PutObject(t, "models", "tiny/model.safetensors", bytes.NewReader(weights), int64(len(weights)))
	s3.PutObject(t, "models", "tiny/config.json", strings.NewReader("{}"), 2)

	sock := startDaemon(t)
	getenv := func(k string) string { return os.Getenv(k) }

	cli := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Run(t.Context(), append(args, "--api", sock), &Env{Stdout: &out, Stderr: &errOut, Getenv: getenv})
		return code, out.String(), errOut.String()
	}
	code, _, stderr := cli("cache", "add", "tiny", "--source", "s3://models/tiny/", "--wait", "--timeout", "60s")
	if code != 0 {
		t.Fatalf("cache add: %d %s", code, stderr)
	}
	if !strings.Contains(stderr, "tiny ready") {
		t.Fatalf("no ready line in %q", stderr)
	}
	code, stdout, stderr := cli("cache", "status", "tiny", "-o", "json")
	if code != 0 {
		t.Fatalf("cache status: %d %s", code, stderr)
	}
	var st api.CacheStatus
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status JSON %q: %v", stdout, err)
	}
	got, err := os.ReadFile(filepath.Join(st.Path, "model.safetensors"))
	if !st.Ready || err != nil || !bytes.Equal(got, weights) {
		t.Fatalf("status %+v, read err %v", st, err)
	}
	if code, stdout, _ = cli("cache", "ls"); code != 0 || !strings.Contains(stdout, "tiny") || !strings.Contains(stdout, "ready") {
		t.Fatalf("cache ls: %d %q", code, stdout)
	}
	if code, _, stderr = cli("cache", "rm", "nope"); code != exitNotFound || !strings.Contains(stderr, "not a desired cache") {
		t.Fatalf("cache rm nope: %d %q", code, stderr)
	}
	if code, stdout, _ = cli("cache", "rm", "tiny"); code != 0 || !strings.Contains(stdout, "removed") {
		t.Fatalf("cache rm: %d %q", code, stdout)
	}
}

// startDaemon runs `warmfleet daemon` in-process on a temporary data
// directory, with S3 settings from the process environment, and returns its
// API address once it answers; the test's cleanup stops it and checks it
// exited cleanly.
func startDaemon(t *testing.T, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	sock := "unix://" + filepath.Join(dir, "api.sock")
	launchDaemon(t, os.Getenv, append([]string{"--data-dir", filepath.Join(dir, "data"), "--api", sock,
		"--part-size", "1MiB", "--reserve", "0", "--reserve-fraction", "0", "--containerd", "off"}, extra...)...)
	// The socket file appears at bind, a moment before listen: wait for a
	// connection, not for the file.
	wait.Err(t, "daemon API answers", func() error {
		c, err := net.Dial("unix", filepath.Join(dir, "api.sock"))
		if err == nil {
			c.Close()
		}
		return err
	}, wait.Timeout(30*time.Second))
	return sock
}

func TestProgressLine(t *testing.T) {
	st := api.CacheStatus{Name: "m", BytesDone: 512 << 20, BytesTotal: 1 << 30, State: api.StateDownloading}
	if got, want := progressLine(st, 100<<20, 10), "m [=====     ]  50% 512.0 MiB/1.0 GiB 100.0 MiB/s downloading"; got != want {
		t.Fatalf("progressLine = %q, want %q", got, want)
	}
	if got := progressLine(api.CacheStatus{Name: "m"}, 0, 0); !strings.HasPrefix(got, "m   0% 0 B/0 B") {
		t.Fatalf("empty progressLine = %q", got)
	}
}

// TestCacheFromHubCommands warms an hf:// cache through the daemon and the
// client commands, with --include, from a local Hub given by
// --hf-endpoint: the status names the commit, in JSON and in the table.
func TestCacheFromHubCommands(t *testing.T) {
	hub := hubserver.New(t)
	weights := bytes.Repeat([]byte("hub"), 700_000)
	commit := hub.Push("org/tiny", "main", map[string]hubserver.File{
		"model.safetensors": {Data: weights, LFS: true},
		"config.json":       {Data: []byte("{}")},
	})
	sock := startDaemon(t, "--hf-endpoint", hub.Endpoint())
	cli := cliOn(t, sock)
	if code, _, stderr := cli("cache", "add", "org/tiny", "--source", "hf://org/tiny", "--include", "*.safetensors", "--wait", "--timeout", "60s"); code != 0 {
		t.Fatalf("cache add: %d %s", code, stderr)
	}
	st := statusJSON(t, cli, "org/tiny")
	got, err := os.ReadFile(filepath.Join(st.Path, "model.safetensors"))
	if !st.Ready || st.Commit != commit || st.Files != 1 || err != nil || !bytes.Equal(got, weights) {
		t.Fatalf("status %+v (want commit %s, 1 file), read err %v", st, commit, err)
	}
	if code, stdout, _ := cli("cache", "status", "org/tiny"); code != 0 || !strings.Contains(stdout, st.RevisionID+" @"+commit) {
		t.Fatalf("cache status table: %d %q, want the revision and @%s", code, stdout, commit)
	}
	if code, _, stderr := cli("cache", "add", "org/bad", "--source", "hf://org/tiny", "--include", "[x"); code != exitUsage || !strings.Contains(stderr, "include pattern") {
		t.Fatalf("a bad --include: %d %q, want a usage error", code, stderr)
	}
}
