package cli

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/router/llmsim"
)

// startSim serves a simulated inference backend for model on addr until
// the test ends, or until the returned function stops it. The llmsim
// command is the lab's (internal/lab); the router's tests here run the
// same engine directly.
func startSim(t *testing.T, addr, model string) (stop func()) {
	t.Helper()
	cfg := llmsim.Defaults()
	cfg.Model = model
	sim, err := llmsim.New(cfg, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return func() { _ = srv.Close() }
}

// complete sends a small completion request for model to the router at
// addr and returns the status (0 when the request failed) and body.
func complete(addr, model string) (int, string) {
	body := fmt.Sprintf(`{"model":%q,"prompt":"hello fleet","max_tokens":2}`, model)
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
