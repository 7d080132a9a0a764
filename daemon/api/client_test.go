package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestClientGivesUpOnSilentDaemon: a daemon that accepts the connection but
// never answers (stopped, wedged) gets an error, not a CLI that hangs.
func TestClientGivesUpOnSilentDaemon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := NewClient("unix:///run/warmfleet-test/api.sock", "")
		if err != nil {
			t.Fatal(err)
		}
		// The daemon end reads the request and then says nothing.
		daemons := make(chan net.Conn, 8)
		c.http.Transport.(*http.Transport).DialContext = func(context.Context, string, string) (net.Conn, error) {
			client, daemon := net.Pipe()
			daemons <- daemon
			go func() {
				defer daemon.Close()
				if _, err := http.ReadRequest(bufio.NewReader(daemon)); err != nil {
					return
				}
				buf := make([]byte, 1)
				_, _ = daemon.Read(buf) // until the client hangs up
			}()
			return client, nil
		}
		done := make(chan error, 1)
		go func() {
			_, err := c.Caches(context.Background())
			done <- err
		}()
		// An hour is far past any time the client may wait.
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("silent daemon: no error")
			}
			t.Logf("silent daemon: %v", err)
		default:
			for len(daemons) > 0 {
				(<-daemons).Close()
			}
			t.Logf("after closing the connections: %v", <-done)
			t.Fatal("the client still waits for a silent daemon after an hour")
		}
	})
}

// Every call reads a bounded answer and reports a non-2xx one as a
// *StatusError, /metrics included: a 403 page is not a metrics text.
func TestMetricsAndHealthReportRefusals(t *testing.T) {
	var code atomic.Int32
	code.Store(http.StatusForbidden)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := int(code.Load()); c != http.StatusOK {
			http.Error(w, `{"error":"token required"}`, c)
			return
		}
		fmt.Fprintln(w, "warmfleet_up 1")
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(strings.TrimPrefix(srv.URL, "http://"), "")
	if err != nil {
		t.Fatal(err)
	}
	var se *StatusError
	if text, err := c.Metrics(t.Context()); !errors.As(err, &se) || se.Code != http.StatusForbidden || se.Message != "token required" {
		t.Fatalf("Metrics on a 403 = %q, %v; want a StatusError 403 with the daemon's message", text, err)
	}
	if err := c.Health(t.Context()); !errors.As(err, &se) || se.Code != http.StatusForbidden {
		t.Fatalf("Health on a 403 = %v; want a StatusError 403", err)
	}
	code.Store(http.StatusOK)
	if text, err := c.Metrics(t.Context()); err != nil || text != "warmfleet_up 1\n" {
		t.Fatalf("Metrics = %q, %v", text, err)
	}
	if err := c.Health(t.Context()); err != nil {
		t.Fatalf("Health = %v", err)
	}
}
