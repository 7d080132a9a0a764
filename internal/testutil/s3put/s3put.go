// Package s3put writes objects to an S3-compatible server for tests,
// benchmarks and the demo: buckets and streaming uploads of bodies that need
// not be seekable.
package s3put

import (
	"context"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// MakeBucket creates a bucket.
func MakeBucket(ctx context.Context, c *s3.Client, bucket string) error {
	if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		return fmt.Errorf("create bucket %s: %w", bucket, err)
	}
	return nil
}

// Put uploads size bytes of body as bucket/key in one request. The payload
// is sent unsigned and the body's Seek is hidden, so the SDK streams it once
// instead of reading it twice to sign it.
func Put(ctx context.Context, c *s3.Client, bucket, key string, body io.Reader, size int64) error {
	_, err := c.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(bucket),
		Key:           aws.String(key),
		Body:          struct{ io.Reader }{body},
		ContentLength: aws.Int64(size),
	}, s3.WithAPIOptions(v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware))
	if err != nil {
		return fmt.Errorf("put s3://%s/%s: %w", bucket, key, err)
	}
	return nil
}
