// Package hforigin fetches a model's files from a Hugging Face Hub (or a
// mirror or air-gapped proxy speaking the same protocol) onto local
// storage, with what s3origin offers for S3: strict names, parallel ranged
// GETs that resume, a pinned version and end-to-end verification.
//
// # Protocol
//
// The endpoints are the ones huggingface_hub (hf_api.py, file_download.py)
// and huggingface.js (lib/list-files.ts) call:
//
//   - GET {endpoint}/api/models/{repo}/revision/{rev} (HfApi.model_info):
//     the JSON "sha" is the commit the branch, tag or commit rev names now.
//     It is read once per List; every later request names that commit, so
//     a branch that moves while a model downloads is a new revision for the
//     next List, never a mix of two.
//   - GET {endpoint}/api/models/{repo}/tree/{commit}[/{subdir}]?recursive=true
//     (HfApi.list_repo_tree): pages of entries {type, path, size, oid,
//     lfs: {oid, size}}, the next page named by a Link: <url>; rel="next"
//     header. oid is the git blob id; lfs.oid the sha256 of an LFS file.
//   - HEAD/GET {endpoint}/{repo}/resolve/{commit}/{path} (hf_hub_url): a
//     small file is served by the Hub itself (ETag: its git blob id); an LFS
//     file answers 302 to a CDN, with X-Linked-Etag (its sha256),
//     X-Linked-Size and X-Repo-Commit. A relative redirect (a renamed repo)
//     is followed on the Hub; the CDN address is asked once per file and
//     then read with Range requests, asked again when it expires.
//
// Revisions and paths are escaped as url.PathEscape does
// (quote(revision, safe="") in huggingface_hub).
//
// # Trust
//
// The token (HF_TOKEN, HF_TOKEN_PATH, $HF_HOME/token) goes as
// "Authorization: Bearer" to the Hub's own host only: never to a CDN or any
// redirect target on another host. Every name the Hub lists must be a safe
// relative path (s3origin.ValidRelPath) under the subdir; API answers are
// read through size limits (MaxAPIBody, MaxFiles, MaxPages). A downloaded
// file is accepted only when its sha256 (LFS) or git blob id
// (sha1("blob <size>\x00" + content)) matches the listing.
//
// # Failures
//
// 429 and 5xx answers and broken connections are retried with exponential
// backoff and jitter, waiting at least what Retry-After asks (capped by
// MaxRetryAfter). 401 and 403 from the Hub are final, with an error that
// names the repository and how to pass a token. Errors wrap s3origin's
// kinds (ErrCorrupt, ErrSourceChanged, ErrNotFound, ErrAccessDenied,
// ErrUnsafeKey, ErrServer, ErrEmpty), so callers treat both origins alike.
package hforigin

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/internal/s3origin"
)

// Defaults and limits for Options: s3origin's, so both origins accept the
// same daemon settings.
const (
	DefaultEndpoint      = "https://huggingface.co"
	DefaultConcurrency   = s3origin.DefaultConcurrency
	DefaultPartSize      = s3origin.DefaultPartSize
	DefaultMaxAttempts   = s3origin.DefaultMaxAttempts
	DefaultStallTimeout  = s3origin.DefaultStallTimeout
	DefaultMaxRetryAfter = 5 * time.Minute
)

// Bounds on what the Hub's API answers may make us hold.
const (
	// MaxAPIBody caps one API answer (a model-info document or a tree page).
	MaxAPIBody = 16 << 20
	// MaxFiles caps the files of one listing.
	MaxFiles = 100_000
	// MaxPages caps the pages of one tree listing.
	MaxPages = 1000
)

// Options tune a Client. The zero value talks to huggingface.co without a
// token; FromEnv fills Endpoint and Token the way huggingface_hub does.
type Options struct {
	// Endpoint is the Hub's base URL (default https://huggingface.co).
	Endpoint string
	// Token is sent as a bearer token to the Hub's host; empty sends none.
	Token string
	// Include keeps only files matching one of these patterns, Exclude
	// then drops files matching one of its own. A pattern holding a '/'
	// is matched (path.Match) against the path under the subdir, one
	// without against the file's base name: "*.safetensors" keeps every
	// safetensors file, "onnx/*.onnx" only those in onnx/.
	Include, Exclude []string
	// Concurrency, PartSize, MaxAttempts, RetryBackoff and StallTimeout
	// mean what they mean in s3origin.Options (same defaults and limits).
	Concurrency  int
	PartSize     int64
	MaxAttempts  int
	RetryBackoff time.Duration
	StallTimeout time.Duration
	// MaxRetryAfter caps how long a Retry-After may make us wait (default
	// 5 minutes): a hostile or broken answer cannot park a download.
	MaxRetryAfter time.Duration
	// Logger receives retry notes (default: discard).
	Logger *slog.Logger
	// OnBytes is called with the size of every chunk read from a file's
	// body, from several goroutines at once (the daemon's origin-bytes
	// metric).
	OnBytes func(n int)
	// Transport replaces the HTTP transport (tests, proxies).
	Transport http.RoundTripper
}

// FromEnv returns o with Endpoint from HF_ENDPOINT and Token from HF_TOKEN,
// else the file HF_TOKEN_PATH names, else $HF_HOME/token (HF_HOME defaults
// to ~/.cache/huggingface), where they are not set already. A missing token
// file is no error: public repositories need none.
func (o Options) FromEnv() (Options, error) { return o.FromGetenv(os.Getenv) }

// FromGetenv is FromEnv reading the environment through getenv.
func (o Options) FromGetenv(getenv func(string) string) (Options, error) {
	if o.Endpoint == "" {
		o.Endpoint = getenv("HF_ENDPOINT")
	}
	if o.Token != "" {
		return o, nil
	}
	if tok := strings.TrimSpace(getenv("HF_TOKEN")); tok != "" {
		o.Token = tok
		return o, nil
	}
	file := getenv("HF_TOKEN_PATH")
	if file == "" {
		home := getenv("HF_HOME")
		if home == "" {
			dir, err := os.UserHomeDir()
			if err != nil {
				return o, nil
			}
			home = filepath.Join(dir, ".cache", "huggingface")
		}
		file = filepath.Join(home, "token")
	}
	tok, err := ReadTokenFile(file)
	if err != nil && !os.IsNotExist(err) {
		return o, err
	}
	o.Token = tok
	return o, nil
}

// ReadTokenFile reads a token file (one line, as `hf auth login` writes).
func ReadTokenFile(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4097))
	if err != nil {
		return "", fmt.Errorf("read token file %s: %w", name, err)
	}
	tok := strings.TrimSpace(string(b))
	if len(b) > 4096 || strings.ContainsAny(tok, "\r\n\t ") {
		return "", fmt.Errorf("token file %s: want one token on one line", name)
	}
	return tok, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.Endpoint == "" {
		o.Endpoint = DefaultEndpoint
	}
	o.Endpoint = strings.TrimRight(o.Endpoint, "/")
	if u, err := url.Parse(o.Endpoint); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" {
		return o, fmt.Errorf("hub endpoint %q: want http(s)://host[/path]", o.Endpoint)
	}
	if strings.ContainsAny(o.Token, "\r\n") {
		return o, fmt.Errorf("hub token: has a line break")
	}
	for _, p := range append(append([]string(nil), o.Include...), o.Exclude...) {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return o, fmt.Errorf("file pattern %q: not a valid path.Match pattern", p)
		}
	}
	// Zero picks the default.
	o.Concurrency = cmp.Or(o.Concurrency, DefaultConcurrency)
	o.PartSize = cmp.Or(o.PartSize, DefaultPartSize)
	o.MaxAttempts = cmp.Or(o.MaxAttempts, DefaultMaxAttempts)
	o.RetryBackoff = cmp.Or(max(o.RetryBackoff, 0), s3origin.DefaultRetryBackoff)
	o.StallTimeout = cmp.Or(max(o.StallTimeout, 0), DefaultStallTimeout)
	o.MaxRetryAfter = cmp.Or(max(o.MaxRetryAfter, 0), DefaultMaxRetryAfter)
	switch {
	case o.Concurrency < 1 || o.Concurrency > s3origin.MaxConcurrency:
		return o, fmt.Errorf("hub concurrency %d: want 1..%d", o.Concurrency, s3origin.MaxConcurrency)
	case o.PartSize < s3origin.MinPartSize || o.PartSize > s3origin.MaxPartSize:
		return o, fmt.Errorf("hub part size %d: want %d (1 MiB) .. %d (1 GiB)", o.PartSize, s3origin.MinPartSize, s3origin.MaxPartSize)
	case o.MaxAttempts < 1:
		return o, fmt.Errorf("hub max attempts %d: want >= 1", o.MaxAttempts)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.OnBytes == nil {
		o.OnBytes = func(int) {}
	}
	return o, nil
}

// Client fetches files from one Hub endpoint.
type Client struct {
	opts    Options
	hubHost string // the only host that gets the token
	// api follows no redirect on its own: resolve follows the relative
	// ones itself and records the CDN's address; get follows redirects but
	// strips the token off any other host.
	api, get *http.Client
	// sleep waits d or until ctx ends; tests replace it to see the delays
	// asked for without waiting them.
	sleep func(ctx context.Context, d time.Duration) error

	// ranges holds the locators OpenRange reads files through, so a
	// swarm origin reading a file piece by piece resolves it once.
	rangesMu sync.Mutex
	ranges   map[locatorKey]*locator
}

// locatorKey names a file version: a commit's file and its digest.
type locatorKey struct{ repo, commit, path, digest string }

// maxRangeLocators bounds Client.ranges; past it, the map starts over.
const maxRangeLocators = 4096

// New builds a Client.
func New(opts Options) (*Client, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(opts.Endpoint)
	tr := opts.Transport
	if tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = max(100, 2*opts.Concurrency)
		t.MaxIdleConnsPerHost = 2 * opts.Concurrency
		t.ResponseHeaderTimeout = opts.StallTimeout
		t.ReadBufferSize = 64 << 10
		t.WriteBufferSize = 64 << 10
		// Weights do not compress; a gzip'd body would also make ranges lie.
		t.DisableCompression = true
		tr = t
	}
	c := &Client{opts: opts, hubHost: u.Host, sleep: s3origin.SleepCtx, ranges: map[locatorKey]*locator{}}
	c.api = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	c.get = &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return fmt.Errorf("%w: more than 5 redirects", s3origin.ErrServer)
		}
		if req.URL.Host != c.hubHost {
			req.Header.Del("Authorization")
		}
		return nil
	}}
	return c, nil
}

// Endpoint is the Hub's base URL, for messages.
func (c *Client) Endpoint() string { return c.opts.Endpoint }

// PartSize is the configured part size.
func (c *Client) PartSize() int64 { return c.opts.PartSize }

// newRequest builds a request to u, with the token when u is on the Hub's
// own host.
func (c *Client) newRequest(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	if c.opts.Token != "" && req.URL.Host == c.hubHost {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
	req.Header.Set("User-Agent", "warmfleet-hforigin")
	return req, nil
}
