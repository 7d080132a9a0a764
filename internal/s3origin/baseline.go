package s3origin

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// PlainCopy is the benchmark baseline: the parallel ranged-GET copy a user
// writes by hand with the SDK (what the v1 s3manager.Downloader did). A
// HEAD for the size, then concurrency workers each GET one partSize range
// and io.Copy it into the file at its offset. No resume, no version pinning,
// no verification, and the SDK's default retries only.
func PlainCopy(ctx context.Context, client *s3.Client, bucket, key, dstPath string, concurrency int, partSize int64) error {
	if concurrency < 1 || partSize < 1 {
		return fmt.Errorf("plain copy: concurrency %d and part size %d must be positive", concurrency, partSize)
	}
	head, err := client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		return fmt.Errorf("plain copy: head s3://%s/%s: %w", bucket, key, err)
	}
	size := aws.ToInt64(head.ContentLength)
	f, err := os.Create(dstPath)
	if err != nil {
		return fmt.Errorf("plain copy: %w", err)
	}
	parts := make([]int, Parts(size, partSize))
	for i := range parts {
		parts[i] = i
	}
	err = eachPart(ctx, concurrency, 0, parts, func(ctx context.Context, part int, _ []byte) error {
		off, n := PartRange(part, size, partSize)
		out, err := client.GetObject(ctx, &s3.GetObjectInput{
			Bucket: aws.String(bucket), Key: aws.String(key),
			Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1)),
		})
		if err != nil {
			return err
		}
		_, err = io.Copy(io.NewOffsetWriter(f, off), out.Body)
		_ = out.Body.Close()
		return err
	})
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("plain copy s3://%s/%s: %w", bucket, key, err)
	}
	return f.Close()
}
