package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// TestNoS3Credentials: a daemon that finds no S3 credentials at all says
// so, names the variables that give them and AWS_ENDPOINT_URL_S3 for a
// server other than AWS, names the listing once (it said "list X: list X:"
// before), and `cache add --wait` ends at once with that reason.
func TestNoS3Credentials(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"} {
		t.Setenv(k, "")
	}
	none := filepath.Join(t.TempDir(), "none")
	t.Setenv("AWS_CONFIG_FILE", none)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", none)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true") // no instance role on a test machine
	sock := startDaemon(t)
	// Without someone acting the cache cannot become ready: the wait ends
	// at once (the timeout only bounds the old behaviour, a retry loop).
	code, stderr := runBounded(t, sock, "cache", "add", "m", "--source", "s3://models/m/", "--wait", "--timeout", "10s")
	if code != exitFailure || !strings.Contains(stderr, "list s3://models/m/: no S3 credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") ||
		!strings.Contains(stderr, "AWS_ENDPOINT_URL_S3") || strings.Count(stderr, "list s3://models/m/") != 1 {
		t.Errorf("exit %d, stderr %q; want 1 naming the variables that give credentials and the endpoint, the listing named once", code, stderr)
	}
}
