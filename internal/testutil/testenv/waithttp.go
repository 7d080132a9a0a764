package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// WaitHTTP polls url until it answers any HTTP response (an S3 gateway
// answers 403 to anonymous requests), exited closes (the service died) or
// ctx ends. dial, when not nil, is how to reach url (from inside a network
// namespace, say).
func WaitHTTP(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), url string, exited <-chan struct{}) error {
	client := &http.Client{
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, DialContext: dial},
		Timeout:   2 * time.Second,
	}
	// A request must not hang on someone else's listener after the service
	// died on a taken port.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.Body.Close()
		}
		last = err
		select {
		case <-exited:
			return errors.New("exited before answering HTTP")
		default:
		}
		select {
		case <-exited:
			return errors.New("exited before answering HTTP")
		case <-ctx.Done():
			return fmt.Errorf("%s not answering HTTP: %w (last error: %v)", url, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
