package s3origin

import (
	"bytes"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/warmfleet/warmfleet/internal/testutil/origintest"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// The S3 client, against a real versitygw, passes the suite the in-memory
// origin passes (origin/memorigin), so the daemon's tests on that one hold
// for S3 too.
func TestConformance(t *testing.T) {
	origintest.Run(t, func(t *testing.T) origintest.Fixture {
		s := testenv.StartS3(t)
		s.CreateBucket(t, bucket)
		o := newOrigin(t, s, s.Endpoint, Options{})
		return origintest.Fixture{
			Origin: AsOrigin(o.Client), Bucket: bucket, Missing: "nope", PartSize: MinPartSize,
			Put: func(t *testing.T, key string, data []byte) {
				s.PutObject(t, bucket, key, bytes.NewReader(data), int64(len(data)))
			},
			Delete: func(t *testing.T, key string) {
				if _, err := s.Client(t).DeleteObject(t.Context(), &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)}); err != nil {
					t.Fatal(err)
				}
			},
			Bytes: o.bytes.Load,
		}
	})
}
