package imagecache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
)

// Errors a pull is classified into, for callers (errors.Is) and for the
// failures metric. The original error stays wrapped.
var (
	ErrNotFound     = errors.New("image not found in registry")
	ErrUnauthorized = errors.New("registry refused the credentials")
	ErrUnreachable  = errors.New("registry unreachable")
)

var allReasons = []string{"not_found", "unauthorized", "unreachable", "canceled", "other"}

// classify wraps err with the matching sentinel, so "pull x: registry
// unreachable: dial tcp ...: connection refused" reads well and
// errors.Is works.
func classify(err error) error {
	if err == nil {
		return nil
	}
	for _, s := range []error{ErrNotFound, ErrUnauthorized, ErrUnreachable} {
		if errors.Is(err, s) {
			return err
		}
	}
	var status remoteerrors.ErrUnexpectedStatus
	var netErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.As(err, &status) && (status.StatusCode == 401 || status.StatusCode == 403):
		return fmt.Errorf("%w: %w", ErrUnauthorized, err)
	case errors.As(err, &status) && status.StatusCode == 404:
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errdefs.IsUnauthorized(err), errdefs.IsPermissionDenied(err):
		return fmt.Errorf("%w: %w", ErrUnauthorized, err)
	case errdefs.IsNotFound(err):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.As(err, &dnsErr), errors.As(err, &netErr):
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	case strings.Contains(err.Error(), "401 Unauthorized"):
		return fmt.Errorf("%w: %w", ErrUnauthorized, err)
	}
	return err
}

// errorReason is the failures metric's label for a classified error.
func errorReason(err error) string {
	switch {
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrUnauthorized):
		return "unauthorized"
	case errors.Is(err, ErrUnreachable):
		return "unreachable"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "other"
}
