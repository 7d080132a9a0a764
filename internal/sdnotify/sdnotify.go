// Package sdnotify tells systemd how a long-running command is doing, over
// the notification socket of sd_notify(3): READY=1 once it serves, WATCHDOG=1
// at half the unit's WatchdogSec while it is alive, STOPPING=1 when it
// begins to shut down.
//
// systemd passes the socket in NOTIFY_SOCKET and the watchdog period in
// WATCHDOG_USEC (with WATCHDOG_PID naming the process meant). Outside
// systemd, or in a unit without Type=notify, neither is set and nothing is
// sent: the commands run the same everywhere. A message that cannot be sent
// is logged, never fatal: the service itself works without its manager
// hearing about it, and systemd's own timeouts then say what went wrong.
package sdnotify

import (
	"context"
	"log/slog"
	"sync"
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"
)

// sender delivers one notification; without a socket it sends nothing and
// reports no error.
type sender func(state string) error

// Notifier sends a process's notifications.
type Notifier struct {
	log      *slog.Logger
	send     sender
	watchdog time.Duration // 0 = no watchdog
}

// FromEnv returns a notifier for the socket and watchdog systemd passed.
// A malformed WATCHDOG_USEC is logged and the watchdog left off.
func FromEnv(log *slog.Logger) *Notifier {
	wd, err := sd.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd watchdog off", "err", err)
		wd = 0
	}
	return &Notifier{log: log, send: func(s string) error { _, err := sd.SdNotify(false, s); return err }, watchdog: wd}
}

func (n *Notifier) notify(state string) {
	if err := n.send(state); err != nil {
		n.log.Warn("systemd notification", "state", state, "err", err)
	}
}

// PingInterval is how often a watchdog of period wd is fed: half of it, as
// sd_watchdog_enabled(3) advises, so one late tick does not miss it.
func PingInterval(wd time.Duration) time.Duration { return wd / 2 }

// Serving tells systemd the service is ready and feeds the watchdog, when
// the unit has one, each time alive reports nil (nil alive: always). A
// wedged alive check stops the pings, so systemd restarts the service.
// The returned stopping tells systemd the service is shutting down and
// stops the pings; it may be called more than once.
func (n *Notifier) Serving(alive func() error) (stopping func()) {
	n.notify(sd.SdNotifyReady)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if n.watchdog > 0 {
		wg.Go(func() { n.feed(ctx, alive) })
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			n.notify(sd.SdNotifyStopping)
		})
	}
}

// feed pings the watchdog until ctx ends.
func (n *Notifier) feed(ctx context.Context, alive func() error) {
	t := time.NewTicker(PingInterval(n.watchdog))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if alive != nil {
			if err := alive(); err != nil {
				n.log.Error("not alive: systemd watchdog not fed", "err", err)
				continue
			}
		}
		n.notify(sd.SdNotifyWatchdog)
	}
}
