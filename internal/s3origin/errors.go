package s3origin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/warmfleet/warmfleet/origin"
)

// Kinds of failure a caller may act on (errors.Is works on every error this
// package returns): package origin's, so every origin's errors read alike.
var (
	ErrNoCredentials = origin.ErrNoCredentials
	ErrCredentials   = origin.ErrCredentials
	ErrAccessDenied  = origin.ErrAccessDenied
	ErrNoSuchBucket  = origin.ErrNoSuchBucket
	ErrNotFound      = origin.ErrNotFound
	ErrUnreachable   = origin.ErrUnreachable
	ErrSourceChanged = origin.ErrSourceChanged
	ErrCorrupt       = origin.ErrCorrupt
	ErrEmpty         = origin.ErrEmpty
	ErrUnsafeKey     = origin.ErrUnsafeKey
	ErrServer        = origin.ErrServer
)

// taggedCredentials marks the errors of the credential chain it wraps as
// noCredentialsError, so that explain can tell "no credentials anywhere"
// from the SDK's other failures, which arrive as text in its errors.
type taggedCredentials struct{ aws.CredentialsProvider }

func (t taggedCredentials) Retrieve(ctx context.Context) (aws.Credentials, error) {
	creds, err := t.CredentialsProvider.Retrieve(ctx)
	if err != nil && ctx.Err() == nil {
		err = &noCredentialsError{err: err}
	}
	return creds, err
}

// IsCredentialsProvider lets the SDK see the wrapped provider's type (it
// treats anonymous credentials apart).
func (t taggedCredentials) IsCredentialsProvider(target aws.CredentialsProvider) bool {
	return aws.IsCredentialsProvider(t.CredentialsProvider, target)
}

// noCredentialsError is a credential chain's failure to find credentials.
type noCredentialsError struct{ err error }

func (e *noCredentialsError) Error() string { return ErrNoCredentials.Error() + ": " + e.err.Error() }
func (e *noCredentialsError) Unwrap() error { return e.err }

// errorCode returns the S3 error code and HTTP status of err, if any.
func errorCode(err error) (code string, status int) {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code = apiErr.ErrorCode()
	}
	var respErr *awshttp.ResponseError
	if errors.As(err, &respErr) {
		status = respErr.HTTPStatusCode()
	}
	return code, status
}

// explain wraps err from an S3 call on what (for example
// "list s3://b/p/") with the kind of failure and a hint a user can act on.
func (c *Client) explain(err error, what string) error {
	if err == nil {
		return nil
	}
	if ctxErr := contextError(err); ctxErr != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var none *noCredentialsError
	if errors.As(err, &none) {
		return fmt.Errorf("%s: %w: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or give the node an instance role), "+
			"and AWS_ENDPOINT_URL_S3 for an S3 server other than AWS (now %s); the SDK's credential chain said: %w", what, ErrNoCredentials, c.endpoint, none.err)
	}
	code, status := errorCode(err)
	switch {
	case code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "InvalidToken" ||
		code == "ExpiredToken" || code == "TokenRefreshRequired" || code == "InvalidSecurity" ||
		code == "XAdminUserNotFound": // versitygw's answer to an unknown access key
		return fmt.Errorf("%s: %w (%s): check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the role: %w",
			what, ErrCredentials, code, err)
	case code == "NoSuchBucket":
		return fmt.Errorf("%s: %w at %s: %w", what, ErrNoSuchBucket, c.endpoint, err)
	case code == "AccessDenied" || code == "AllAccessDisabled" || code == "AccountProblem" ||
		(status == 403 && code == "Forbidden"):
		// HEAD answers carry no body, so a bare 403 may also be a bad key.
		return fmt.Errorf("%s: %w: the credentials lack permission (s3:ListBucket / s3:GetObject) or are wrong: %w",
			what, ErrAccessDenied, err)
	case code == "PreconditionFailed" || status == 412:
		return fmt.Errorf("%s: %w (its ETag no longer matches): fetch again to get the new version: %w",
			what, ErrSourceChanged, err)
	case code == "NoSuchKey" || code == "NoSuchVersion" || code == "NotFound" || status == 404:
		return fmt.Errorf("%s: %w: %w", what, ErrNotFound, err)
	case IsUnreachable(err):
		return fmt.Errorf("%s: %w: cannot connect to %s: %w", what, ErrUnreachable, c.endpoint, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func contextError(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return context.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return context.DeadlineExceeded
	}
	return nil
}

// IsUnreachable tells a failure to reach the endpoint at all (dial, DNS,
// refused, no route) from one on a connection that was open.
func IsUnreachable(err error) bool {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return true
	}
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// retryable tells whether a failed GET (or a body read) may succeed when
// tried again: throttling, 5xx, request timeouts, and connections that break
// or stall. Changes of the source, missing objects and permission problems
// are final.
func retryable(err error) bool {
	var local LocalError
	if errors.As(err, &local) {
		return false
	}
	switch {
	case err == nil, contextError(err) != nil,
		errors.Is(err, ErrSourceChanged), errors.Is(err, ErrServer), errors.Is(err, ErrNotFound):
		return false
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, ErrShortBody),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE):
		return true
	}
	var timeout *awshttp.ResponseTimeoutError
	if errors.As(err, &timeout) {
		return true
	}
	return retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err) == aws.TrueTernary
}
