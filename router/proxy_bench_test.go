package router

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/router/prefix"
)

// BenchmarkProxy: one request through the router over loopback HTTP to a
// backend that answers at once, as the bench's overhead phase sends them
// (a 16k-character chat body), so what it measures is the router's path:
// body read, scan, decision, the hop and the copy of the answer. The
// backend's own cost is in both this and a direct request
// (direct=true: the same requests straight to the backend, in the same
// run, so the difference is what the router adds); compare before/after,
// not against a goal.
func BenchmarkProxy(b *testing.B) {
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) { benchProxy(b, stream, false) })
	}
	b.Run("stream=false/direct=true", func(b *testing.B) { benchProxy(b, false, true) })
}

func benchProxy(b *testing.B, stream, direct bool) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if !stream {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{`{"choices":[{"delta":{"content":"o"}}]}`, `{"choices":[{"delta":{"content":"k"}}]}`, "[DONE]"} {
			_, _ = io.WriteString(w, "data: "+ev+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	defer backend.Close()
	cfg := Defaults()
	cfg.ProbeInterval = -1
	cfg.Backends = []BackendConfig{{URL: backend.URL}}
	rt, err := New(cfg, Options{Source: NewStaticSource(StaticEndpoints(&cfg), nil), HashKey: prefix.KeyFromBytes([]byte("k")),
		Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = rt.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	front := httptest.NewServer(rt)
	defer front.Close()
	target := front.URL
	if direct {
		target = backend.URL
	}
	body := fmt.Appendf(nil, `{"model":"m","stream":%v,"messages":[{"role":"user","content":"%s"}]}`, stream, strings.Repeat("abcdefgh ", 16000/9))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true, WriteBufferSize: 64 << 10}}
	defer client.CloseIdleConnections()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		resp, err := client.Post(target+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || n == 0 {
			b.Fatalf("status %d, %d bytes, err %v", resp.StatusCode, n, err)
		}
	}
}
