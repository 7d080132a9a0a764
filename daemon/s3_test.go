package daemon

import (
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// These tests run the daemon against a real S3 server (versitygw): the
// same bodies as their in-memory twins, so what those show of the daemon
// holds with the S3 client too.

// newS3Fixture holds files on a real S3 server.
func newS3Fixture(t *testing.T, files map[string]int) *fixture {
	t.Helper()
	fx := &fixture{s3: testenv.StartS3(t), bucket: "models"}
	fx.s3.CreateBucket(t, fx.bucket)
	return fx.fill(t, files)
}

func TestCacheFromS3(t *testing.T) { testCache(t, newS3Fixture) }

func TestRestartResumesWithoutRefetchingS3(t *testing.T) {
	testRestartResumesWithoutRefetching(t, newS3Fixture)
}

func TestVerifyRepairsFlippedByteS3(t *testing.T) { testVerifyRepairsFlippedByte(t, newS3Fixture) }

func TestObjectDeletedMidDownloadS3(t *testing.T) { testObjectDeletedMidDownload(t, newS3Fixture) }
