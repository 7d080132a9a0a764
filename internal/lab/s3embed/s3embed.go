// Package s3embed serves an S3-compatible API from inside the process, so
// `warmfleet-lab demo` can show the whole flow (list, ranged GETs, verification)
// with no S3 account and no other program. It wraps gofakes3 with its
// in-memory backend; the daemon talks to it through the same s3origin code
// it uses for real S3.
//
// Known differences from S3, checked by this package's tests: gofakes3
// accepts any credentials (it does not verify signatures), ignores If-Match
// on GET (s3origin then detects a change by comparing each response's ETag
// with the listed one), and reports no checksums (s3origin verifies by the
// MD5 ETag). Objects live in memory, so keep demo models small.
package s3embed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Credentials clients should present. The server accepts any, but the SDK
// refuses to sign without some.
const (
	AccessKey = "warmfleet-demo"
	SecretKey = "warmfleet-demo-secret"
	Region    = "us-east-1"
)

// Options tune Start.
type Options struct {
	// AllowNonLoopback permits listening on a non-loopback address. The
	// server checks no credentials, so anyone who can reach it can read
	// and write every object.
	AllowNonLoopback bool
	// Seed, if not nil, fills the server before addr answers anything: it
	// runs against a private loopback listener of the same server, while
	// connections to addr wait in its backlog, so no client ever lists a
	// half-uploaded model. Start returns Seed's error.
	Seed func(ctx context.Context, s *Server) error
}

// Server is a running embedded S3 server.
type Server struct {
	// s3 describes the server as the tests' S3 helpers know one (its
	// endpoint and keys), so seeding it and pointing a process at it go
	// through the same code as for versitygw.
	s3        testenv.S3
	srv       *http.Server
	serving   sync.WaitGroup // a Serve per listener
	closeOnce sync.Once
	closeErr  error
	stopWatch func() bool
}

// Start listens on addr (host:port; port 0 picks one) and serves until
// Close or until ctx ends.
func Start(ctx context.Context, addr string, opts Options) (*Server, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("embedded S3 address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); !opts.AllowNonLoopback && (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		return nil, fmt.Errorf("embedded S3 address %q: not a loopback address, and the server checks no credentials", addr)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("embedded S3: %w", err)
	}
	fake := gofakes3.New(s3mem.New(),
		gofakes3.WithLogger(gofakes3.DiscardLog()),
		// Path-style only: "bucket.127.0.0.1" cannot resolve anyway.
		gofakes3.WithHostBucket(false),
	)
	s := &Server{
		srv: &http.Server{
			Handler:           fake.Server(),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          log.New(io.Discard, "", 0),
		},
	}
	s.stopWatch = context.AfterFunc(ctx, func() { _ = s.Close() })
	if opts.Seed != nil {
		if err := s.seed(ctx, opts.Seed); err != nil {
			_ = ln.Close()
			return nil, errors.Join(err, s.Close())
		}
	}
	s.serve(ln)
	return s, nil
}

// serve serves ln, which becomes the server's endpoint, until ln or the
// server is closed; the channel is closed then.
func (s *Server) serve(ln net.Listener) <-chan struct{} {
	s.s3 = testenv.S3{Endpoint: "http://" + ln.Addr().String(), Addr: ln.Addr().String(),
		AccessKey: AccessKey, SecretKey: SecretKey, Region: Region}
	done := make(chan struct{})
	s.serving.Add(1)
	go func() {
		defer s.serving.Done()
		defer close(done)
		_ = s.srv.Serve(ln)
	}()
	return done
}

// seed runs fill against a private loopback listener, closed after it.
func (s *Server) seed(ctx context.Context, fill func(context.Context, *Server) error) error {
	var lc net.ListenConfig
	private, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("embedded S3: seed listener: %w", err)
	}
	done := s.serve(private)
	err = fill(ctx, s)
	// Closing it ends its Serve, which then forgets it (Close would
	// otherwise report closing it twice); the connections it accepted stay
	// with the server, which closes them when it is closed.
	_ = private.Close()
	<-done
	if err != nil {
		return fmt.Errorf("embedded S3: seed: %w", err)
	}
	return nil
}

// Endpoint is the server's base URL, for AWS_ENDPOINT_URL_S3 or
// s3origin.Options.Endpoint.
func (s *Server) Endpoint() string { return s.s3.Endpoint }

// Credentials returns a static provider with the demo keys.
func (s *Server) Credentials() aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, "")
}

// Env returns AWS_* variables pointing a child process at the server.
func (s *Server) Env() []string { return s.s3.Env() }

// Close stops the server; objects are gone.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.stopWatch != nil {
			s.stopWatch()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			// net/http's Shutdown waits up to 5 s for a connection that has
			// not sent a request yet, longer than the grace period: what is
			// left then is closed, not reported. (Such a connection is the
			// likely cause of a CI failure here; it was not reproduced.)
			cerr := s.srv.Close()
			if !errors.Is(err, context.DeadlineExceeded) || cerr != nil {
				s.closeErr = errors.Join(err, cerr)
			}
		}
		s.serving.Wait()
	})
	return s.closeErr
}

// CreateBucket creates a bucket.
func (s *Server) CreateBucket(ctx context.Context, name string) error {
	return s.s3.MakeBucket(ctx, name)
}

// PutObject stores size bytes from r as bucket/key, streaming them through
// the S3 API. It fits synthmodel's Upload.
func (s *Server) PutObject(ctx context.Context, bucket, key string, r io.Reader, size int64) error {
	return s.s3.Put(ctx, bucket, key, r, size)
}
