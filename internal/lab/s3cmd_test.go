package lab

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// TestS3Command starts `warmfleet-lab s3` with two models, takes the AWS_*
// settings it prints as a user pasting them would, lists each model
// through the AWS SDK with them, and interrupts it.
func TestS3Command(t *testing.T) {
	out := newOutFile(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"s3", "--listen", "127.0.0.1:0", "--model", "demo/llama:2MiB", "--model", "demo/org/tiny:1MiB", "--shards", "2"},
			&cli.Env{Stdout: out.f, Stderr: out.f, Getenv: func(string) string { return "" }})
	}()
	wait.For(t, "the AWS_* exports", func() bool {
		select {
		case code := <-done:
			t.Fatalf("s3 exited %d before it was interrupted:\n%s", code, out.String())
		default:
		}
		return strings.Contains(out.String(), "export AWS_EC2_METADATA_DISABLED=true")
	})
	env := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if kv, ok := strings.CutPrefix(line, "export "); ok {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	}
	for _, k := range []string{"AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} {
		if env[k] == "" {
			t.Fatalf("s3 does not print %s:\n%s", k, out.String())
		}
	}
	client := s3.New(s3.Options{
		BaseEndpoint: aws.String(env["AWS_ENDPOINT_URL_S3"]), Region: env["AWS_REGION"], UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], ""),
	})
	for prefix, shards := range map[string]int{"llama/": 2, "org/tiny/": 2} {
		list, err := client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("demo"), Prefix: aws.String(prefix)})
		if err != nil {
			t.Fatalf("list s3://demo/%s: %v", prefix, err)
		}
		safetensors := 0
		for _, o := range list.Contents {
			if strings.HasSuffix(aws.ToString(o.Key), ".safetensors") {
				safetensors++
			}
		}
		if safetensors != shards || len(list.Contents) != shards+2 {
			t.Errorf("s3://demo/%s holds %d objects, %d safetensors; want %d safetensors, config.json and the index", prefix, len(list.Contents), safetensors, shards)
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("s3 exited %d when interrupted:\n%s", code, out.String())
	}
}

// TestS3CommandBadInput: a malformed --model or a listen address off
// loopback is refused with what to give instead, before anything serves.
func TestS3CommandBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--model", "demo:1GiB"}, 2, "want a prefix after the bucket"},
		{[]string{"--model", "demo/llama"}, 2, "want BUCKET/PREFIX:SIZE"},
		{[]string{"--model", "Demo_Bucket/llama:1MiB"}, 2, "is not an S3 bucket name"},
		{[]string{"--model", "demo/llama:lots"}, 2, "size"},
		{[]string{"--model", "demo/llama:1KiB"}, 2, "want 1MiB.."},
		{[]string{"--model", "demo/llama:2TiB"}, 2, "want 1MiB.."},
		{[]string{"--listen", "9000"}, 2, "want host:port"},
		{[]string{"--listen", "0.0.0.0:0"}, 1, "not a loopback address"},
		{[]string{"extra"}, 2, "unexpected arguments"},
	} {
		var out, errOut bytes.Buffer
		code := Run(t.Context(), append([]string{"s3"}, c.args...), &cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }})
		if code != c.code || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("s3 %q: exit %d, stderr %q; want exit %d and %q", c.args, code, errOut.String(), c.code, c.want)
		}
		if out.Len() != 0 {
			t.Errorf("s3 %q printed %q on stdout, want nothing", c.args, out.String())
		}
	}
}
