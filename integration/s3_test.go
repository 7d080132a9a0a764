package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
)

// TestS3FromHostNamespace lists a bucket on the S3 host from a client
// process inside h0, then has S3 throttle one request through the fault
// proxy and checks the client sees it.
func TestS3FromHostNamespace(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 1, Link: 200 * netlab.Mbit, S3: true, S3Front: netlabtest.FaultFront})
	faults := netlabtest.Faults(t, lab)
	ctx := t.Context()
	s3h := lab.S3()
	if err := s3h.MakeBucket(ctx, "models"); err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("warmfleet"), 1000)
	for _, key := range []string{"m/a.safetensors", "m/b.safetensors"} {
		if err := s3h.Put(ctx, "models", key, bytes.NewReader(body), int64(len(body))); err != nil {
			t.Fatal(err)
		}
	}

	list := func() (string, error) {
		cmd := netlabtest.HelperCommand(ctx, lab.Hosts()[0], "s3list", append(s3h.Env(), "NETLAB_BUCKET=models")...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return stdout.String(), fmt.Errorf("%w: %s", err, stderr.String())
		}
		return stdout.String(), nil
	}
	out, err := list()
	if err != nil {
		t.Fatalf("s3list in h0: %v", err)
	}
	want := fmt.Sprintf("m/a.safetensors %d\nm/b.safetensors %d\n", len(body), len(body))
	if out != want {
		t.Fatalf("s3list in h0 = %q, want %q", out, want)
	}

	faults.SlowDown(1)
	if _, err := list(); err == nil || !strings.Contains(err.Error(), "SlowDown") {
		t.Errorf("s3list during SlowDown: err = %v, want a SlowDown error", err)
	}
	if got := faults.Stats().SlowDowns; got != 1 {
		t.Errorf("fault proxy answered %d SlowDowns, want 1", got)
	}
	if out, err := list(); err != nil || out != want {
		t.Errorf("s3list after SlowDown = %q, %v; want %q", out, err, want)
	}

	// A body cut by a reset reaches the client as an error, not as a short
	// object.
	get := func() (string, error) {
		cmd := netlabtest.HelperCommand(ctx, lab.Hosts()[0], "s3get", append(s3h.Env(), "NETLAB_BUCKET=models", "NETLAB_KEY=m/a.safetensors")...)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	faults.ResetAfter(1000, 1)
	if out, err := get(); err == nil {
		t.Errorf("s3get through a reset = %q, want an error", out)
	}
	if got := faults.Stats().Resets; got != 1 {
		t.Errorf("fault proxy reset %d bodies, want 1", got)
	}
	if out, err := get(); err != nil || out != fmt.Sprint(len(body)) {
		t.Errorf("s3get after the reset = %q, %v; want %d bytes", out, err, len(body))
	}
}

// helperS3Get reads NETLAB_BUCKET/NETLAB_KEY in one attempt and prints how
// many body bytes arrived.
func helperS3Get(ctx context.Context) error {
	client, err := helperS3Client()
	if err != nil {
		return err
	}
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(os.Getenv("NETLAB_BUCKET")), Key: aws.String(os.Getenv("NETLAB_KEY"))})
	if err != nil {
		return err
	}
	defer out.Body.Close()
	n, err := io.Copy(io.Discard, out.Body)
	if err != nil {
		return fmt.Errorf("after %d bytes: %w", n, err)
	}
	fmt.Println(n)
	return nil
}

// helperS3List lists NETLAB_BUCKET at AWS_ENDPOINT_URL_S3 with one attempt
// per request, printing "key size" lines.
func helperS3List(ctx context.Context) error {
	client, err := helperS3Client()
	if err != nil {
		return err
	}
	out, err := client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(os.Getenv("NETLAB_BUCKET"))})
	if err != nil {
		return err
	}
	for _, o := range out.Contents {
		fmt.Printf("%s %d\n", aws.ToString(o.Key), aws.ToInt64(o.Size))
	}
	return nil
}

// helperS3Client is an S3 client from the AWS_* environment that tries
// each request once, so faults show.
func helperS3Client() (*s3.Client, error) {
	endpoint := os.Getenv("AWS_ENDPOINT_URL_S3")
	if endpoint == "" {
		return nil, errors.New("AWS_ENDPOINT_URL_S3 not set")
	}
	return s3.New(s3.Options{
		Region:           os.Getenv("AWS_REGION"),
		BaseEndpoint:     aws.String(endpoint),
		UsePathStyle:     true,
		Credentials:      credentials.NewStaticCredentialsProvider(os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), ""),
		HTTPClient:       awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) { t.Proxy = nil }),
		RetryMaxAttempts: 1,
	}), nil
}
