package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/warmfleet/warmfleet/daemon"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/health"
	"github.com/warmfleet/warmfleet/internal/ui"
)

//go:generate go test -run ^TestMetricsReference$ -update-metrics-doc .

// daemonProbes is what the daemon's readiness is made of, filled in as
// start-up goes: the daemon once its state is loaded, the fleet once gossip
// runs, serving once the API answers.
type daemonProbes struct {
	ready   health.Readiness
	daemon  atomic.Pointer[daemon.Daemon]
	serving atomic.Bool
}

// newDaemonProbes lists the daemon's readiness conditions in start-up
// order: state loaded, API serving, and with join set at least one other
// fleet member alive.
func newDaemonProbes(join []string, fleet *atomic.Pointer[gossip.Node]) *daemonProbes {
	p := &daemonProbes{}
	p.ready.Add("state", func() error {
		d := p.daemon.Load()
		if d == nil {
			return errors.New("not loaded yet")
		}
		return d.StateErr()
	})
	p.ready.Add("api", func() error {
		if !p.serving.Load() {
			return errors.New("not serving")
		}
		return nil
	})
	if len(join) > 0 {
		p.ready.Add("fleet", func() error {
			n := fleet.Load()
			if n == nil {
				return errors.New("gossip not started yet")
			}
			return joinedErr(n.Members(), join)
		})
	}
	return p
}

// joinedErr reports that no member other than this node is alive.
func joinedErr(members []gossip.Member, join []string) error {
	if othersAlive(members) {
		return nil
	}
	return fmt.Errorf("no other member joined yet (joining %s)", strings.Join(join, ","))
}

// othersAlive reports whether a member other than this node is alive.
func othersAlive(members []gossip.Member) bool {
	for _, m := range members {
		if !m.Self && m.State == gossip.MemberAlive {
			return true
		}
	}
	return false
}

// Gather serves the daemon's registry once the daemon is loaded; before,
// a scrape fails and says why, so the scraper records the target as down
// rather than as a node with no caches.
func (p *daemonProbes) Gather() ([]*dto.MetricFamily, error) {
	d := p.daemon.Load()
	if d == nil {
		return nil, errors.New("state not loaded yet")
	}
	return d.Registry().Gather()
}

var _ prometheus.Gatherer = (*daemonProbes)(nil)

// fleetView is the status page's snapshot: the fleet as `warmfleet fleet`
// shows it, once the daemon is loaded.
func (p *daemonProbes) fleetView() (any, error) {
	d := p.daemon.Load()
	if d == nil {
		return nil, errors.New("state not loaded yet")
	}
	return d.Fleet(), nil
}

// handler is what the metrics listener serves: probes, metrics and the
// status page, all read-only, so the listener needs no token.
func (p *daemonProbes) handler() http.Handler {
	mux := http.NewServeMux()
	health.Mount(mux, p, p.ready.Err)
	ui.Mount(mux, "fleet", p.fleetView)
	return mux
}

// startMetrics opens the read-only metrics and probe listener on addr and
// serves h there as a part stopped with the other listeners. An address
// that cannot be taken is an error before anything else starts.
func startMetrics(ps *parts, log *slog.Logger, addr string, h http.Handler) error {
	if addr == "" {
		return nil
	}
	ln, err := health.Listen(ps.ctx, addr)
	if err != nil {
		return err
	}
	srv := health.Server(h)
	log.Info("metrics listener", "addr", ln.Addr().String())
	ps.start(stageListeners, "metrics listener", serveHTTP(srv, ln), shutdownHTTP(srv, 5*time.Second, nil))
	return nil
}
