package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"

	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/lab/s3embed"
	"github.com/warmfleet/warmfleet/internal/testutil/synthmodel"
)

// modelSpec is one --model BUCKET/PREFIX:SIZE of `warmfleet-lab s3`.
type modelSpec struct {
	bucket, prefix string // prefix ends in "/"
	size           int64
}

// bucketName is S3's rule for bucket names (3 to 63 lowercase letters,
// digits, dots and hyphens, starting and ending with a letter or digit).
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// parseModelSpec parses BUCKET/PREFIX:SIZE, e.g. demo/llama:1GiB.
func parseModelSpec(s string) (modelSpec, error) {
	path, size, ok := strings.Cut(s, ":")
	if !ok {
		return modelSpec{}, fmt.Errorf("--model %q: want BUCKET/PREFIX:SIZE, e.g. demo/llama:1GiB", s)
	}
	bucket, prefix, _ := strings.Cut(path, "/")
	prefix = strings.Trim(prefix, "/")
	if !bucketName.MatchString(bucket) {
		return modelSpec{}, fmt.Errorf("--model %q: bucket %q is not an S3 bucket name (3-63 lowercase letters, digits, dots and hyphens)", s, bucket)
	}
	if prefix == "" || strings.Contains(prefix, "//") || strings.HasPrefix(prefix, ".") {
		return modelSpec{}, fmt.Errorf("--model %q: want a prefix after the bucket, e.g. %s/llama:1GiB", s, bucket)
	}
	var n cli.ByteSize
	if err := n.Set(size); err != nil {
		return modelSpec{}, fmt.Errorf("--model %q: size: %w", s, err)
	}
	if n < 1<<20 || n > synthmodel.MaxSize {
		return modelSpec{}, fmt.Errorf("--model %q: size %s: want 1MiB..%s", s, size, bytesize.Format(synthmodel.MaxSize))
	}
	return modelSpec{bucket: bucket, prefix: prefix + "/", size: int64(n)}, nil
}

// runS3 serves an S3 API on a loopback address, with synthetic models in
// it, until interrupted: a local origin to try the CLI against. It prints
// the AWS_* settings a daemon or the AWS CLI needs to use it.
func runS3(ctx context.Context, e *cli.Env, args []string) error {
	fs := cli.NewFlagSet(e, "s3")
	listen := fs.String("listen", "127.0.0.1:9000", "loopback address to serve on (port 0 picks one)")
	var models cli.ListFlag
	fs.Var(&models, "model", "a synthetic model to put at BUCKET/PREFIX:SIZE, e.g. demo/llama:1GiB (repeatable; held in memory)")
	shards := fs.Int("shards", 4, "safetensors files per model (config.json and the index come with them)")
	if err := cli.ParseFlags(fs, e, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError("unexpected arguments %q", fs.Args())
	}
	if _, _, err := net.SplitHostPort(*listen); err != nil {
		return cli.UsageError("--listen %q: want host:port, e.g. 127.0.0.1:9000", *listen)
	}
	var specs []modelSpec
	for _, m := range models {
		spec, err := parseModelSpec(m)
		if err != nil {
			return cli.UsageError("%v", err)
		}
		specs = append(specs, spec)
	}
	built := make([]*synthmodel.Model, len(specs))
	for i, spec := range specs {
		m, err := synthmodel.New(synthmodel.Options{Seed: uint64(i + 1), Size: spec.size, Shards: *shards, Name: spec.prefix})
		if err != nil {
			return cli.UsageError("--model %s%s: %v", spec.bucket, "/"+spec.prefix, err)
		}
		built[i] = m
	}
	// The models go in before the address answers: a daemon started at
	// once must not list half a model.
	srv, err := s3embed.Start(ctx, *listen, s3embed.Options{Seed: func(ctx context.Context, srv *s3embed.Server) error {
		buckets := map[string]bool{}
		for i, spec := range specs {
			if err := seedModel(ctx, srv, buckets, spec.bucket, spec.prefix, built[i]); err != nil {
				return err
			}
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer srv.Close()
	w := e.Stdout
	fmt.Fprintf(w, "# S3 server at %s (in memory; it accepts any credentials), until interrupted\n", srv.Endpoint())
	for i, spec := range specs {
		fmt.Fprintf(w, "# s3://%s/%s: %d files, %s (synthetic weights)\n", spec.bucket, spec.prefix, len(built[i].Files()), bytesize.Format(built[i].TotalSize()))
	}
	fmt.Fprintf(w, "# paste into the shell that runs warmfleet:\n")
	for _, kv := range srv.Env() {
		fmt.Fprintf(w, "export %s\n", kv)
	}
	<-ctx.Done()
	return nil
}

// seedModel puts model under bucket/prefix, creating the bucket unless
// created (a set of the buckets made so far) holds it.
func seedModel(ctx context.Context, srv *s3embed.Server, created map[string]bool, bucket, prefix string, model *synthmodel.Model) error {
	if !created[bucket] {
		if err := srv.CreateBucket(ctx, bucket); err != nil {
			return fmt.Errorf("create bucket %s: %w", bucket, err)
		}
		created[bucket] = true
	}
	err := model.Upload(ctx, func(ctx context.Context, key string, r io.Reader, n int64) error {
		return srv.PutObject(ctx, bucket, prefix+key, r, n)
	})
	if err != nil {
		return fmt.Errorf("upload s3://%s/%s: %w", bucket, prefix, err)
	}
	return nil
}
