package s3fault

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

func TestProxy(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, "faults")
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	s.PutObject(t, "faults", "obj", bytes.NewReader(data), int64(len(data)))

	p := Start(t, s.Endpoint)
	viaProxy := *s
	viaProxy.Endpoint = p.URL()
	// One attempt per call, so every injected fault reaches the test.
	c := s3.New(viaProxy.NewClient().Options(), func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	ctx := context.Background()
	get := func(rng string) ([]byte, error) {
		in := &s3.GetObjectInput{Bucket: aws.String("faults"), Key: aws.String("obj")}
		if rng != "" {
			in.Range = aws.String(rng)
		}
		out, err := c.GetObject(ctx, in)
		if err != nil {
			return nil, err
		}
		defer out.Body.Close()
		return io.ReadAll(out.Body)
	}

	t.Run("pass through keeps signatures valid", func(t *testing.T) {
		got, err := get("bytes=10-19")
		if err != nil || !bytes.Equal(got, data[10:20]) {
			t.Fatalf("ranged get via proxy: %q, %v", got, err)
		}
	})

	t.Run("slow down for the next n requests", func(t *testing.T) {
		before := p.Stats()
		p.SlowDown(2)
		for i := range 2 {
			_, err := get("")
			var apiErr smithy.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "SlowDown" {
				t.Fatalf("request %d: err %v, want SlowDown", i, err)
			}
		}
		if got, err := get(""); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("third request: %d bytes, %v; want the object", len(got), err)
		}
		st := p.Stats()
		if st.SlowDowns-before.SlowDowns != 2 || st.Requests-before.Requests != 3 {
			t.Errorf("stats %+v (before %+v): want 2 slow downs in 3 requests", st, before)
		}
	})

	t.Run("slow down only GETs", func(t *testing.T) {
		before := p.Stats()
		p.SlowDownGETs(1)
		if _, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("faults"), Key: aws.String("obj")}); err != nil {
			t.Fatalf("HEAD was throttled: %v", err)
		}
		if _, err := get(""); err == nil {
			t.Fatal("GET was not throttled")
		}
		if _, err := get(""); err != nil {
			t.Fatalf("second GET: %v", err)
		}
		if st := p.Stats(); st.SlowDowns-before.SlowDowns != 1 {
			t.Errorf("%d slow downs, want 1", st.SlowDowns-before.SlowDowns)
		}
	})

	t.Run("reset after k body bytes", func(t *testing.T) {
		before := p.Stats()
		p.ResetAfter(100000, 1)
		got, err := get("")
		if err == nil {
			t.Fatalf("read %d bytes without error, want a broken body", len(got))
		}
		// A reset discards what the client had not read yet: it may get
		// fewer bytes than were sent, never other ones or more.
		if len(got) > 100000 || !bytes.Equal(got, data[:len(got)]) {
			t.Errorf("got %d bytes before the reset, want a prefix of the first 100000", len(got))
		}
		// A short response does not use up a fault; the next long one does
		// not break either once the fault is spent.
		p.ResetAfter(100, 1)
		if got, err := get("bytes=0-99"); err != nil || len(got) != 100 {
			t.Errorf("100-byte range with cut at 100: %d bytes, %v", len(got), err)
		}
		if _, err := get(""); err == nil {
			t.Errorf("armed reset did not fire on the next long GET")
		}
		if got, err := get(""); err != nil || !bytes.Equal(got, data) {
			t.Errorf("after faults are spent: %d bytes, %v", len(got), err)
		}
		if st := p.Stats(); st.Resets-before.Resets != 2 {
			t.Errorf("resets %d, want 2", st.Resets-before.Resets)
		}
	})

	t.Run("pass through disarms", func(t *testing.T) {
		p.SlowDown(5)
		p.ResetAfter(0, 5)
		p.PassThrough()
		if got, err := get(""); err != nil || !bytes.Equal(got, data) {
			t.Errorf("after PassThrough: %d bytes, %v", len(got), err)
		}
	})
}

func TestNewRejectsBadTarget(t *testing.T) {
	for _, target := range []string{"", "127.0.0.1:9000", "ftp://x", "http://"} {
		if _, err := New(target); err == nil {
			t.Errorf("New(%q) succeeded", target)
		}
	}
}
