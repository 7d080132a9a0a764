package hforigin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warmfleet/warmfleet/internal/s3origin"
)

// statusError is an HTTP answer we did not want.
type statusError struct {
	status int
	host   string
	// code and msg are the Hub's X-Error-Code and X-Error-Message.
	code, msg string
	// retryAfter is what Retry-After asked for (0 when absent).
	retryAfter time.Duration
}

func (e *statusError) Error() string {
	s := fmt.Sprintf("%s answered %d %s", e.host, e.status, http.StatusText(e.status))
	if e.code != "" {
		s += " (" + e.code + ")"
	}
	if e.msg != "" {
		s += ": " + e.msg
	}
	return s
}

// newStatusError reads what an error answer says about itself.
func newStatusError(resp *http.Response, now time.Time) *statusError {
	clean := func(s string) string {
		s = strings.Map(func(r rune) rune {
			if r < 0x20 || r == 0x7f {
				return -1
			}
			return r
		}, s)
		if len(s) > 200 {
			s = s[:200] + "..."
		}
		return s
	}
	return &statusError{
		status:     resp.StatusCode,
		host:       resp.Request.URL.Host,
		code:       clean(resp.Header.Get("X-Error-Code")),
		msg:        clean(resp.Header.Get("X-Error-Message")),
		retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), now),
	}
}

// parseRetryAfter reads delay-seconds or an HTTP date; anything else, or a
// date in the past, is no delay.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, 86400)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), 24*time.Hour)
	}
	return 0
}

// retryDelay is the wait before retry number attempt (1-based):
// s3origin.Backoff, but never less than a Retry-After the error carries,
// capped at maxAfter.
func retryDelay(err error, attempt int, base, maxAfter time.Duration, r float64) time.Duration {
	d := s3origin.Backoff(attempt, base, r)
	var se *statusError
	if errors.As(err, &se) && se.retryAfter > d {
		d = min(se.retryAfter, maxAfter)
	}
	return d
}

// retryable tells whether a failed request may succeed when tried again:
// throttling, server errors, broken or stalled connections.
func retryable(err error) bool {
	var local s3origin.LocalError
	var se *statusError
	var ne net.Error
	switch {
	case err == nil, errors.As(err, &local), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, s3origin.ErrSourceChanged), errors.Is(err, s3origin.ErrServer):
		return false
	case errors.Is(err, errExpired):
		return true
	case errors.As(err, &se):
		return se.status == http.StatusTooManyRequests || se.status == http.StatusRequestTimeout || se.status >= 500
	case errors.Is(err, s3origin.ErrShortBody), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE),
		errors.As(err, &ne):
		return true
	}
	return false
}

// explain wraps a final failure of what (for example "list hf://org/m")
// with the kind s3origin callers test for and a hint a user can act on.
func (c *Client) explain(err error, repo, what string) error {
	var se *statusError
	if !errors.As(err, &se) {
		if s3origin.IsUnreachable(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: %w: %s: %w", what, s3origin.ErrUnreachable, c.opts.Endpoint, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	switch {
	case (se.status == http.StatusUnauthorized || se.status == http.StatusForbidden) && se.host == c.hubHost:
		hint := "pass a token with read access: set HF_TOKEN, or write it to $HF_HOME/token (HF_TOKEN_PATH names another file)"
		if c.opts.Token != "" {
			hint = "the token was sent: check it is valid and that its account was granted access to the repository (gated models need the terms accepted on the Hub)"
		}
		return fmt.Errorf("%s: %w: repository %s is gated, private or missing at %s: %s: %w",
			what, s3origin.ErrAccessDenied, repo, c.opts.Endpoint, hint, err)
	case se.status == http.StatusNotFound && se.host == c.hubHost:
		return fmt.Errorf("%s: %w: %w", what, s3origin.ErrNotFound, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
