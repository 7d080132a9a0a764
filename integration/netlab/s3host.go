package netlab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/s3put"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Credentials of the lab's S3 server. They guard a server that is reachable
// only inside one lab for the duration of one run.
const (
	labS3AccessKey = "netlabaccesskey"
	labS3SecretKey = "netlabsecretkey0123456789abcdef"
	labS3Region    = "us-east-1"
)

// Ports on the S3 host.
const (
	s3Port        = 9000 // what hosts use: the server itself, or the fault proxy
	s3BackendPort = 9001 // the server, on the S3 host's loopback
)

// S3Host is a host running versitygw (a real S3 server) with a posix backend
// in its directory.
type S3Host struct {
	*Host
	// Endpoint is the URL hosts use (through the S3 host's link, and
	// through Faults when the lab has a fault proxy).
	Endpoint  string
	AccessKey string
	SecretKey string
	Region    string
	// Server is the versitygw process.
	Server *Process
	// Front is the handler from Options.S3Front in front of the server,
	// or nil.
	Front http.Handler
}

func startS3Host(ctx context.Context, l *Lab, h *Host, bin string, front func(string) (http.Handler, error)) (*S3Host, error) {
	if bin == "" {
		bin = "versitygw"
	}
	bin, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("netlab: s3 host: versitygw: %w", err)
	}
	withProxy := front != nil
	backendDir := filepath.Join(h.DataDir, "buckets")
	if err := os.MkdirAll(backendDir, 0o755); err != nil {
		return nil, fmt.Errorf("netlab: s3 host: %w", err)
	}
	s := &S3Host{
		Host:      h,
		Endpoint:  "http://" + h.Addr(s3Port),
		AccessKey: labS3AccessKey,
		SecretKey: labS3SecretKey,
		Region:    labS3Region,
	}
	ports := []string{"--port", net.JoinHostPort("127.0.0.1", fmt.Sprint(s3BackendPort))}
	if !withProxy {
		ports = append(ports, "--port", h.Addr(s3Port))
	}
	s.Server, err = h.Start(ProcSpec{
		Name: "versitygw",
		Path: bin,
		Args: append(ports, "--access", s.AccessKey, "--secret", s.SecretKey, "--region", s.Region, "--quiet", "posix", backendDir),
	})
	if err != nil {
		return nil, fmt.Errorf("netlab: s3 host: %w", err)
	}
	if err := waitHTTP(ctx, h.NS, "http://"+s.backendAddr()+"/", s.Server); err != nil {
		return nil, fmt.Errorf("netlab: s3 host: versitygw: %w; log:\n%s", err, s.Server.Log())
	}
	if withProxy {
		if err := s.startFront(l, front); err != nil {
			return nil, fmt.Errorf("netlab: s3 host: %w", err)
		}
	}
	l.log.Info("netlab: s3 up", "endpoint", s.Endpoint, "front", withProxy)
	return s, nil
}

func (s *S3Host) backendAddr() string {
	return net.JoinHostPort("127.0.0.1", fmt.Sprint(s3BackendPort))
}

// startFront serves the front handler on the S3 host's address. Such a
// handler (s3fault.Proxy, say) dials its target from the harness's own
// namespace, so the target is a loopback relay of ours that reaches
// versitygw from inside the S3 namespace.
func (s *S3Host) startFront(l *Lab, front func(string) (http.Handler, error)) error {
	relayLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("s3 front relay: %w", err)
	}
	relay := NewProxy(relayLn, func(ctx context.Context) (net.Conn, error) {
		return s.NS.DialContext(ctx, "tcp", s.backendAddr())
	})
	l.onClose(relay.Close)
	handler, err := front("http://" + relayLn.Addr().String())
	if err != nil {
		return err
	}
	ln, err := s.NS.Listen("tcp", s.Addr(s3Port))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	// Registered after the relay, so it closes first.
	l.onClose(func() error {
		err := srv.Close()
		<-served
		return err
	})
	s.Front = handler
	return nil
}

// Env returns the AWS_* variables that point a daemon on a lab host at this
// server.
func (s *S3Host) Env() []string {
	return testenv.AWSEnv(s.Endpoint, s.AccessKey, s.SecretKey, s.Region)
}

// Client returns an S3 client for the harness that talks to the server
// from inside the S3 host, over its loopback: seeding data this way neither
// crosses a shaped link nor counts as traffic of any host.
func (s *S3Host) Client() *s3.Client {
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.Proxy = nil
		t.DialContext = s.NS.DialContext
	})
	return s3.New(s3.Options{
		Region:                     s.Region,
		BaseEndpoint:               aws.String("http://" + s.backendAddr()),
		UsePathStyle:               true,
		Credentials:                credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		HTTPClient:                 hc,
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
	})
}

// MakeBucket creates a bucket.
func (s *S3Host) MakeBucket(ctx context.Context, bucket string) error {
	return s3put.MakeBucket(ctx, s.Client(), bucket)
}

// Put uploads size bytes of body as bucket/key in one streaming request.
func (s *S3Host) Put(ctx context.Context, bucket, key string, body io.Reader, size int64) error {
	return s3put.Put(ctx, s.Client(), bucket, key, body, size)
}

// waitHTTP waits, from inside ns, for url to answer while proc runs.
func waitHTTP(ctx context.Context, ns Netns, url string, proc *Process) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return testenv.WaitHTTP(ctx, ns.DialContext, url, proc.Done())
}
