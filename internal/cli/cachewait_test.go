package cli

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// runBounded runs one CLI command against the daemon at sock and returns
// its exit code and stderr; a command that does not return within a minute
// fails the test (the bound only keeps a hang from stalling CI).
func runBounded(t *testing.T, sock string, args ...string) (int, string) {
	t.Helper()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(t.Context(), append(args, "--api", sock), &Env{Stdout: &out, Stderr: &errOut, Getenv: os.Getenv})
	}()
	var code int
	wait.For(t, strings.Join(args, " ")+" to return", func() bool {
		select {
		case code = <-done:
			return true
		default:
			return false
		}
	}, wait.Timeout(time.Minute))
	return code, errOut.String()
}

// TestCacheAddWaitEnds: `cache add --wait` without --timeout returns at once,
// with the reason and what to do next, when the cache will not become ready
// on this node without someone acting: a source with no objects, a node the
// targets leave out. A missing cache exits 3.
func TestCacheAddWaitEnds(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	s3.PutObject(t, "models", "tiny/model.safetensors", strings.NewReader("weights"), 7)
	sock := startDaemon(t)

	code, stderr := runBounded(t, sock, "cache", "add", "empty", "--source", "s3://models/nothing-here/", "--wait")
	if code != exitFailure || !strings.Contains(stderr, "no objects") || !strings.Contains(stderr, "warmfleet cache rm empty") {
		t.Errorf("empty prefix: exit %d, stderr %q; want exit 1 with the cache's error and what to do", code, stderr)
	}
	code, stderr = runBounded(t, sock, "cache", "add", "elsewhere", "--source", "s3://models/tiny/", "--selector", "gpu=h100", "--wait")
	if code != exitFailure || !strings.Contains(stderr, "not targeted at this node (targets --selector gpu=h100)") {
		t.Errorf("not targeted: exit %d, stderr %q; want exit 1 saying the node is not targeted", code, stderr)
	}
	if code, stderr = runBounded(t, sock, "cache", "status", "nope"); code != exitNotFound {
		t.Errorf("status of a missing cache: exit %d, stderr %q; want %d", code, stderr, exitNotFound)
	}
}

// TestCacheAddWaitTimeout: when --timeout passes, `cache add --wait` exits 4
// and says where the cache stands and its last error, never the API
// client's deadline error, which reads as if the daemon were down. S3 is
// unreachable here, a failure the daemon retries on its own. Several runs:
// which error won used to depend on timing.
func TestCacheAddWaitTimeout(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	t.Setenv("AWS_ENDPOINT_URL_S3", "http://"+testenv.FreeAddr(t)) // nothing listens there
	sock := startDaemon(t)
	for _, name := range []string{"m1", "m2", "m3"} {
		code, stderr := runBounded(t, sock, "cache", "add", name, "--source", "s3://models/"+name+"/", "--wait", "--timeout", "1s")
		if code != exitTimeout || !strings.Contains(stderr, name+" is not ready after 1s: state ") ||
			!strings.Contains(stderr, "last error: ") || !strings.Contains(stderr, "warmfleet cache status "+name) ||
			strings.Contains(stderr, "deadline exceeded") || strings.Contains(stderr, "daemon at") {
			t.Errorf("%s: exit %d, stderr %q; want exit 4 with where the cache stands", name, code, stderr)
		}
	}
}

// startLabelledDaemon runs a daemon named name with node label gpu=gpu on a
// loopback gossip cluster (joining join, if not empty) and returns its API
// address. deadS3 points its S3 origin at a port nothing listens on, so it
// can never fetch a model (no swarm either: peers cannot help it).
func startLabelledDaemon(t *testing.T, name, gpu, gossipAddr, join string, deadS3 bool) string {
	t.Helper()
	dir := t.TempDir()
	sock := "unix://" + filepath.Join(dir, "api.sock")
	args := []string{"--node-name", name, "--label", "gpu=" + gpu, "--data-dir", filepath.Join(dir, "data"), "--api", sock,
		"--part-size", "1MiB", "--reserve", "0", "--reserve-fraction", "0", "--containerd", "off",
		"--gossip", gossipAddr, "--insecure-gossip", "--kubernetes=false"}
	if join != "" {
		args = append(args, "--join", join)
	}
	var origin s3origin.Options
	if deadS3 {
		origin = s3origin.Options{Endpoint: "http://" + testenv.FreeAddr(t), Region: "us-east-1",
			Credentials: credentials.NewStaticCredentialsProvider("unused", "unused", "")}
	}
	log := &syncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	done, started := make(chan error, 1), make(chan struct{})
	go func() {
		done <- ServeDaemon(ctx, &Env{Stdout: log, Stderr: log, Getenv: noEnv}, args, origin, func() { close(started) })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon %s: %v", name, err)
		}
	})
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("daemon %s: %v\n%s", name, err, log)
	}
	return sock
}

// TestCacheWaitFleet runs `cache wait` on three loopback daemons joined by
// gossip, one of which (c) cannot reach S3: --nodes 2 returns once a and b
// hold the cache, while waits that need c time out (exit 4) naming where
// each target stands. A cache only a and c are targeted for can be ready on
// one node only, so --nodes 2 times out too. A cache no node is targeted
// for, or --nodes beyond what the targets ask, ends at once; an unknown
// cache exits 3. --local waits on the daemon asked. The waits never write
// the spec.
func TestCacheWaitFleet(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	s3.PutObject(t, "models", "tiny/model.safetensors", strings.NewReader("weights"), 7)
	gossipA := testenv.FreeAddr(t)
	a := startLabelledDaemon(t, "a", "h100", gossipA, "", false)
	b := startLabelledDaemon(t, "b", "a100", testenv.FreeAddr(t), gossipA, false)
	c := startLabelledDaemon(t, "c", "h100", testenv.FreeAddr(t), gossipA, true)
	cl, err := api.NewClient(a, "")
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "a sees b and c with their labels", func() bool {
		f, err := cl.Fleet(t.Context())
		if err != nil {
			return false
		}
		n := 0
		for _, m := range f.Members {
			if m.State == "alive" && m.Labels["gpu"] != "" {
				n++
			}
		}
		return n == 3
	})

	for _, add := range [][]string{
		{"cache", "add", "all3", "--source", "s3://models/tiny/"},
		{"cache", "add", "h100", "--source", "s3://models/tiny/", "--selector", "gpu=h100"},
		{"cache", "add", "two", "--source", "s3://models/tiny/", "--nodes", "2"},
		{"cache", "add", "tpu", "--source", "s3://models/tiny/", "--selector", "gpu=tpu"},
	} {
		if code, stderr := runBounded(t, a, add...); code != 0 {
			t.Fatalf("%v: exit %d: %s", add, code, stderr)
		}
	}
	before, err := cl.Cache(t.Context(), "all3")
	if err != nil {
		t.Fatal(err)
	}

	code, stderr := runBounded(t, a, "cache", "wait", "all3", "--nodes", "2", "--timeout", "50s")
	if code != 0 || !strings.Contains(stderr, "all3: 2/3 target nodes ready, waiting for 2") {
		t.Fatalf("wait all3 --nodes 2: exit %d, stderr %q; want 0 once two nodes are ready", code, stderr)
	}
	// Asked of c, which will never hold it: the same fleet-wide answer.
	if code, stderr = runBounded(t, c, "cache", "wait", "all3", "--nodes", "2", "--timeout", "50s"); code != 0 {
		t.Errorf("wait all3 --nodes 2 on c: exit %d, stderr %q", code, stderr)
	}
	code, stderr = runBounded(t, a, "cache", "wait", "all3", "--all", "--timeout", "2s")
	if code != exitTimeout || !strings.Contains(stderr, "all3 is not ready on enough nodes after 2s: 2/3 target nodes ready, waiting for 3") ||
		!strings.Contains(stderr, "  a: ready, 7 B of 7 B (100%)") || !strings.Contains(stderr, "  c: ") || strings.Contains(stderr, "  c: ready") {
		t.Errorf("wait all3 --all: exit %d, stderr %q; want 4 and where a, b and c stand", code, stderr)
	}
	wait.For(t, "h100 ready on a", func() bool {
		st, err := cl.Cache(t.Context(), "h100")
		return err == nil && st.Ready
	})
	code, stderr = runBounded(t, a, "cache", "wait", "h100", "--nodes", "2", "--timeout", "2s")
	if code != exitTimeout || !strings.Contains(stderr, "1/2 target nodes ready, waiting for 2") || strings.Contains(stderr, "  b: ") {
		t.Errorf("wait h100 --nodes 2 (only a can be ready): exit %d, stderr %q; want 4, listing a and c only", code, stderr)
	}

	code, stderr = runBounded(t, a, "cache", "wait", "tpu", "--timeout", "50s")
	if code != exitFailure || !strings.Contains(stderr, "no node is targeted for tpu (targets --selector gpu=tpu)") {
		t.Errorf("wait tpu: exit %d, stderr %q; want 1 at once: no node targeted", code, stderr)
	}
	code, stderr = runBounded(t, a, "cache", "wait", "two", "--nodes", "3", "--timeout", "50s")
	if code != exitFailure || !strings.Contains(stderr, "two is to be held by 2 nodes") {
		t.Errorf("wait two --nodes 3: exit %d, stderr %q; want 1 at once", code, stderr)
	}
	if code, stderr = runBounded(t, a, "cache", "wait", "nope", "--nodes", "1"); code != exitNotFound {
		t.Errorf("wait nope: exit %d, stderr %q; want %d", code, stderr, exitNotFound)
	}
	for _, sock := range []string{a, b} {
		if code, stderr = runBounded(t, sock, "cache", "wait", "all3", "--local", "-o", "json"); code != 0 {
			t.Errorf("wait all3 --local on %s: exit %d, stderr %q", sock, code, stderr)
		}
	}
	if code, stderr = runBounded(t, c, "cache", "wait", "all3", "--local", "--timeout", "1s"); code != exitTimeout {
		t.Errorf("wait all3 --local on c: exit %d, stderr %q; want 4", code, stderr)
	}
	if code, stderr = runBounded(t, a, "cache", "wait", "all3", "--local", "--all"); code != exitUsage {
		t.Errorf("--local --all: exit %d, stderr %q; want %d", code, stderr, exitUsage)
	}

	after, err := cl.Cache(t.Context(), "all3")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after.Targets, before.Targets) || after.Source != before.Source || after.Revision != before.Revision {
		t.Errorf("the waits changed the spec: %+v -> %+v", before, after)
	}
}
