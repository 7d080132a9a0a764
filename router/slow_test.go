package router

import (
	"io"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"
)

// A body is slow by the bytes that arrive, not by the clock alone: one
// that keeps arriving at a fair rate takes no slow-body slot however long
// it takes, one that trickles takes one once slowBodyAfter has passed.
func TestSlowBodyJudgedByBytes(t *testing.T) {
	for _, tc := range []struct {
		name         string
		chunk, total int
		slow         bool
	}{
		{"steady", 1 << 10, 64 << 10, false}, // 20 KiB/s for 3.2 s
		{"trickle", 16, 1 << 10, true},       // 320 B/s for 3.2 s
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := Defaults()
				cfg.ProbeInterval = -1
				cfg.MaxSlowBodies = 1
				cfg.BodyTimeout = time.Minute
				rt, err := New(cfg, Options{Source: NewStaticSource(nil, nil)})
				if err != nil {
					t.Fatal(err)
				}
				pr, pw := io.Pipe()
				go func() {
					for sent := 0; sent < tc.total; sent += tc.chunk {
						time.Sleep(50 * time.Millisecond)
						_, _ = pw.Write(make([]byte, tc.chunk))
					}
					pw.Close()
				}()
				req := httptest.NewRequest("POST", "/v1/completions", pr)
				req.ContentLength = int64(tc.total)
				done := make(chan []byte)
				go func() {
					body, apiErr := rt.readBody(httptest.NewRecorder(), req, &cfg)
					if apiErr != nil {
						t.Errorf("readBody: %v", apiErr.Message)
					}
					done <- body
				}()
				counted := false
				for {
					select {
					case body := <-done:
						if len(body) != tc.total {
							t.Fatalf("read %d bytes, want %d", len(body), tc.total)
						}
						if counted != tc.slow {
							t.Fatalf("counted slow: %v, want %v", counted, tc.slow)
						}
						if n := rt.Slow(); n != 0 {
							t.Fatalf("%d slow bodies once read", n)
						}
						return
					case <-time.After(100 * time.Millisecond):
						synctest.Wait()
						counted = counted || rt.Slow() > 0
					}
				}
			})
		})
	}
}
