package s3origin

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

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
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	parts := make(chan int)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for part := range parts {
				off, n := PartRange(part, size, partSize)
				out, err := client.GetObject(ctx, &s3.GetObjectInput{
					Bucket: aws.String(bucket), Key: aws.String(key),
					Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1)),
				})
				if err != nil {
					cancel(err)
					return
				}
				_, err = io.Copy(io.NewOffsetWriter(f, off), out.Body)
				_ = out.Body.Close()
				if err != nil {
					cancel(err)
					return
				}
			}
		})
	}
feed:
	for part := range Parts(size, partSize) {
		select {
		case parts <- part:
		case <-ctx.Done():
			break feed
		}
	}
	close(parts)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		_ = f.Close()
		return fmt.Errorf("plain copy s3://%s/%s: %w", bucket, key, err)
	}
	return f.Close()
}
