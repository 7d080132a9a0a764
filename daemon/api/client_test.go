package api

import (
	"bufio"
	"context"
	"net"
	"net/http"
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
