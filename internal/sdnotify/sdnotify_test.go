package sdnotify

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

type sent struct {
	at    time.Duration
	state string
}

// recorder keeps what was sent and when, on synctest's clock.
type recorder struct {
	mu    sync.Mutex
	start time.Time
	msgs  []sent
}

func (r *recorder) send(state string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, sent{time.Since(r.start), state})
	return nil
}

func (r *recorder) got() []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// TestServingFeedsTheWatchdog: READY first, WATCHDOG every half period
// while alive, none while alive fails, STOPPING last and no ping after it.
func TestServingFeedsTheWatchdog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{start: time.Now()}
		var sick atomic.Bool
		n := &Notifier{log: slog.New(slog.NewTextHandler(io.Discard, nil)), send: rec.send, watchdog: 10 * time.Second}
		stopping := n.Serving(func() error {
			if sick.Load() {
				return errors.New("state unreadable")
			}
			return nil
		})
		time.Sleep(16 * time.Second) // pings at 5s, 10s, 15s
		sick.Store(true)
		time.Sleep(10 * time.Second) // none at 20s, 25s
		sick.Store(false)
		time.Sleep(5 * time.Second) // one at 30s
		stopping()
		stopping()
		time.Sleep(time.Minute)
		want := []sent{{0, "READY=1"}, {5 * time.Second, "WATCHDOG=1"}, {10 * time.Second, "WATCHDOG=1"},
			{15 * time.Second, "WATCHDOG=1"}, {30 * time.Second, "WATCHDOG=1"}, {31 * time.Second, "STOPPING=1"}}
		if got := rec.got(); !slices.Equal(got, want) {
			t.Fatalf("sent %v\nwant %v", got, want)
		}
	})
}

// TestServingWithoutWatchdog: without WATCHDOG_USEC only READY and
// STOPPING are sent.
func TestServingWithoutWatchdog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{start: time.Now()}
		n := &Notifier{log: slog.New(slog.NewTextHandler(io.Discard, nil)), send: rec.send}
		stopping := n.Serving(nil)
		time.Sleep(time.Hour)
		stopping()
		want := []sent{{0, "READY=1"}, {time.Hour, "STOPPING=1"}}
		if got := rec.got(); !slices.Equal(got, want) {
			t.Fatalf("sent %v, want %v", got, want)
		}
	})
}

// TestFromEnv reads systemd's variables: the socket a datagram goes to,
// and a watchdog only for the process WATCHDOG_PID names.
func TestFromEnv(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "3000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	if n := FromEnv(log); n.watchdog != 3*time.Second {
		t.Errorf("watchdog %v for this process, want 3s", n.watchdog)
	}
	for _, env := range []struct{ usec, pid string }{
		{"3000000", strconv.Itoa(os.Getpid() + 1)}, // another process's
		{"-5", ""}, {"soon", ""}, {"", ""},
	} {
		t.Setenv("WATCHDOG_USEC", env.usec)
		t.Setenv("WATCHDOG_PID", env.pid)
		if n := FromEnv(log); n.watchdog != 0 {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: watchdog %v, want off", env.usec, env.pid, n.watchdog)
		}
	}
	n := FromEnv(log)
	n.Serving(nil)()
	buf := make([]byte, 64)
	for _, want := range []string{"READY=1", "STOPPING=1"} {
		if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		k, err := conn.Read(buf)
		if err != nil || string(buf[:k]) != want {
			t.Fatalf("datagram %q, %v; want %q", buf[:k], err, want)
		}
	}
}
