package cli

import (
	"os"
	"strings"
	"testing"
	"time"

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
