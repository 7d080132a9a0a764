package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to a daemon's API.
type Client struct {
	addr  Addr
	token string
	http  *http.Client
	base  string
}

// NewClient returns a client for addr; token, when set, is sent as a bearer
// token (required by daemons that listen on TCP).
func NewClient(addr string, token string) (*Client, error) {
	a, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{MaxIdleConns: 4, IdleConnTimeout: 30 * time.Second}
	base := "http://" + a.Address
	if a.Network == "unix" {
		base = "http://warmfleet"
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", a.Address)
		}
	}
	return &Client{addr: a, token: token, http: &http.Client{Transport: tr, Timeout: requestTimeout}, base: base}, nil
}

// requestTimeout bounds one API call, so a stopped or wedged daemon gives
// the CLI an error instead of a hang. The daemon answers every call at
// once, bar fleet-wide key operations (bounded at 10 s there); waiting
// (cache add --wait) polls with many calls.
const requestTimeout = time.Minute

// StatusError is a non-2xx answer from the daemon.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Code) }

// IsNotFound reports whether err is a 404 from the daemon.
func IsNotFound(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusNotFound
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	data, err := c.send(ctx, method, path, body)
	if err != nil || out == nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("daemon at %s: bad answer: %w", c.addr, err)
	}
	return nil
}

// maxAnswer bounds what the client reads of one answer.
const maxAnswer = 64 << 20

// send makes one request (with a JSON body when body is not nil) and
// returns the answer's body, read up to maxAnswer; a non-2xx answer is a
// *StatusError carrying the daemon's message.
func (c *Client) send(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("daemon at %s: no answer within %s (is it stopped or stuck?): %w", c.addr, requestTimeout, err)
		}
		return nil, fmt.Errorf("daemon at %s: %w", c.addr, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return nil, fmt.Errorf("daemon at %s: %w", c.addr, err)
	}
	if resp.StatusCode/100 != 2 {
		var e Error
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		return nil, &StatusError{Code: resp.StatusCode, Message: e.Error}
	}
	return data, nil
}

// AddCache asks the daemon (and through it the fleet) to cache a model.
func (c *Client) AddCache(ctx context.Context, req AddCacheRequest) (CacheStatus, error) {
	var st CacheStatus
	err := c.do(ctx, http.MethodPost, "/v1/caches", req, &st)
	return st, err
}

// Caches lists the model caches.
func (c *Client) Caches(ctx context.Context) ([]CacheStatus, error) {
	var st []CacheStatus
	err := c.do(ctx, http.MethodGet, "/v1/caches", nil, &st)
	return st, err
}

// Cache returns one model cache.
func (c *Client) Cache(ctx context.Context, name string) (CacheStatus, error) {
	var st CacheStatus
	err := c.do(ctx, http.MethodGet, "/v1/caches/"+escapeName(name), nil, &st)
	return st, err
}

// Verify asks the daemon to re-hash a ready cache and repair what is
// damaged. It reads the whole model, so only ctx bounds it, not the usual
// per-call timeout.
func (c *Client) Verify(ctx context.Context, name string) (VerifyResult, error) {
	var res VerifyResult
	long := *c
	hc := *c.http
	hc.Timeout = 0
	long.http = &hc
	err := long.do(ctx, http.MethodPost, "/v1/verify/"+escapeName(name), nil, &res)
	return res, err
}

// RemoveCache removes a model cache fleet-wide.
func (c *Client) RemoveCache(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/caches/"+escapeName(name), nil, nil)
}

// Fleet returns the daemon's view of the fleet.
func (c *Client) Fleet(ctx context.Context) (Fleet, error) {
	var f Fleet
	err := c.do(ctx, http.MethodGet, "/v1/fleet", nil, &f)
	return f, err
}

// AddEndpoint registers an inference endpoint on the daemon's node.
func (c *Client) AddEndpoint(ctx context.Context, ep Endpoint) error {
	return c.do(ctx, http.MethodPost, "/v1/endpoints", ep, nil)
}

// Endpoints lists the endpoints registered on the daemon's node.
func (c *Client) Endpoints(ctx context.Context) ([]Endpoint, error) {
	var eps []Endpoint
	err := c.do(ctx, http.MethodGet, "/v1/endpoints", nil, &eps)
	return eps, err
}

// RemoveEndpoint unregisters an endpoint.
func (c *Client) RemoveEndpoint(ctx context.Context, endpointURL string) error {
	return c.do(ctx, http.MethodDelete, "/v1/endpoints?url="+url.QueryEscape(endpointURL), nil, nil)
}

// AddImage asks the fleet to pre-pull an image for an owner.
func (c *Client) AddImage(ctx context.Context, req AddImageRequest) error {
	return c.do(ctx, http.MethodPost, "/v1/images", req, nil)
}

// Images lists the images on the daemon's node.
func (c *Client) Images(ctx context.Context) ([]ImageStatus, error) {
	var out []ImageStatus
	err := c.do(ctx, http.MethodGet, "/v1/images", nil, &out)
	return out, err
}

// RemoveImage drops an owner's claim on an image fleet-wide.
func (c *Client) RemoveImage(ctx context.Context, ref, owner string) error {
	q := url.Values{"ref": {ref}, "owner": {owner}}
	return c.do(ctx, http.MethodDelete, "/v1/images?"+q.Encode(), nil, nil)
}

// Node describes the daemon.
func (c *Client) Node(ctx context.Context) (NodeInfo, error) {
	var n NodeInfo
	err := c.do(ctx, http.MethodGet, "/v1/node", nil, &n)
	return n, err
}

// Metrics returns the Prometheus text exposition.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	b, err := c.send(ctx, http.MethodGet, "/metrics", nil)
	return string(b), err
}

// Health asks /healthz whether the daemon's API is up.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.send(ctx, http.MethodGet, "/healthz", nil)
	return err
}

// escapeName keeps the one '/' of "org/model" as a path separator.
func escapeName(name string) string {
	org, model, ok := strings.Cut(name, "/")
	if !ok {
		return url.PathEscape(name)
	}
	return url.PathEscape(org) + "/" + url.PathEscape(model)
}

// Apply plans and, unless req.DryRun, carries out one source's desired
// state (POST /v1/apply). Another owner's objects make it fail with a 409
// naming them.
func (c *Client) Apply(ctx context.Context, req ApplyRequest) (ApplyResult, error) {
	var res ApplyResult
	err := c.do(ctx, "POST", "/v1/apply", req, &res)
	return res, err
}

// ApplyDir reports the daemon's watched directory (GET /v1/apply-dir).
func (c *Client) ApplyDir(ctx context.Context) (ApplyDirStatus, error) {
	var st ApplyDirStatus
	err := c.do(ctx, "GET", "/v1/apply-dir", nil, &st)
	return st, err
}
