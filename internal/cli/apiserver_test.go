package cli

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/pipenet"
)

// TestAPIServerDropsStalledClients: a client that stops half way through a
// request, or keeps an idle connection open, does not hold a connection
// (and a goroutine) of the daemon forever.
func TestAPIServerDropsStalledClients(t *testing.T) {
	tests := []struct {
		name string
		talk func(t *testing.T, c net.Conn)
	}{
		{"body never sent", func(t *testing.T, c net.Conn) {
			go func() {
				_, _ = io.WriteString(c, "POST /v1/caches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
			}()
		}},
		{"idle after a request", func(t *testing.T, c net.Conn) {
			go func() { _, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") }()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ln := pipenet.Listen()
				srv := apiServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if _, err := io.ReadAll(r.Body); err != nil {
						http.Error(w, err.Error(), http.StatusBadRequest)
					}
				}))
				go func() { _ = srv.Serve(ln) }()
				defer srv.Close()
				c, err := ln.Dial(context.Background(), "", "")
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				tt.talk(t, c)

				closed := make(chan error, 1)
				go func() {
					_, err := io.Copy(io.Discard, c)
					closed <- err
				}()
				// An hour is far past any timeout the API may choose.
				time.Sleep(time.Hour)
				synctest.Wait()
				select {
				case err := <-closed:
					if err != nil && !errors.Is(err, io.EOF) {
						t.Fatalf("connection ended with %v", err)
					}
				default:
					t.Fatal("the server still holds the stalled connection after an hour")
				}
			})
		})
	}
}
