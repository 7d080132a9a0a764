package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// metricFuture counts desired-state records refused for a stamp too far
// ahead of the node's clock.
const metricFuture = "warmfleet_gossip_desired_refused_future_total"

// skews are the wall clocks of clockSkew's hosts, off the real one: two
// healthy nodes minutes apart, and a broken one hours ahead (beyond the
// bound a peer's stamp may be ahead: desired.Options.MaxFuture).
var skews = []time.Duration{0, 5 * time.Minute, -7 * time.Minute, 3 * time.Hour}

func clockSkew(ctx context.Context, f *Fleet) error {
	first, err := f.Seed(ctx, "skew1/", 2, 8<<20, 111)
	if err != nil {
		return err
	}
	second, err := f.Seed(ctx, "skew2/", 2, 8<<20, 112)
	if err != nil {
		return err
	}
	future, err := f.Seed(ctx, "future/", 1, 2<<20, 113)
	if err != nil {
		return err
	}
	var ds []*netlab.Daemon
	for i, h := range f.Lab.Hosts() {
		d, err := f.StartSkewed(ctx, h, skews[i])
		if err != nil {
			return err
		}
		ds = append(ds, d)
	}
	if err := ds[0].WaitMembers(ctx, len(ds)); err != nil {
		return err
	}
	// The node 5 minutes ahead adds the model; everyone warms it, the
	// broken clock too.
	if err := f.Add(ctx, ds[1], "skew", first); err != nil {
		return err
	}
	if err := f.WaitReady(ctx, "skew", first, ds...); err != nil {
		return err
	}
	if err := clocksSkewed(ctx, ds); err != nil {
		return err
	}
	// Later in real time, the node 7 minutes behind (12 behind the first
	// writer's stamp) edits it: its edit must win everywhere.
	if err := f.Add(ctx, ds[2], "skew", second); err != nil {
		return err
	}
	if err := f.WaitReady(ctx, "skew", second, ds...); err != nil {
		return fmt.Errorf("the later edit from the node behind winning: %w", err)
	}
	// The broken clock's own write is refused by the healthy nodes, and
	// counted; the shared checks do not hold anyone to it.
	broken := ds[3]
	if _, err := broken.CLI(ctx, "cache", "add", "future", "--source", future.Source()); err != nil {
		return err
	}
	var refused float64
	for _, d := range ds[:3] {
		err := wait.Until(ctx, func() error {
			n, err := d.MetricValue(ctx, metricFuture)
			if err == nil && n < 1 {
				err = fmt.Errorf("%s refused %v records from the future", d.Host().Name, n)
			}
			refused = n
			return err
		})
		if err != nil {
			return err
		}
		f.Figure("refused_future_"+d.Host().Name, refused)
		if st, err := d.CacheStatus(ctx, "future"); err == nil {
			return fmt.Errorf("%s took a record stamped 3 hours ahead: cache future is %s", d.Host().Name, st.State)
		}
	}
	f.Log.Info("chaos: clock skew", "skews", fmt.Sprint(skews))
	return broken.WaitReady(ctx, "future", future)
}

// clocksSkewed checks that each daemon's clock is off by its skew, as its
// last status change's time shows: otherwise the scenario tests nothing.
func clocksSkewed(ctx context.Context, ds []*netlab.Daemon) error {
	var errs []error
	for i, d := range ds {
		st, err := d.CacheStatus(ctx, "skew")
		if err != nil {
			return err
		}
		// The status changed in the last minute or two of real time.
		if off := time.Until(st.UpdatedAt); off > skews[i] || off < skews[i]-3*time.Minute {
			errs = append(errs, fmt.Errorf("%s's clock is %v off (last change at %v), want about %v", d.Host().Name, off.Round(time.Second), st.UpdatedAt, skews[i]))
		}
	}
	return errors.Join(errs...)
}
