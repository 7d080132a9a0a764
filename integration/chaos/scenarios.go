package chaos

import (
	"bytes"
	"context"
	cryptorand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/p2p"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/s3fault"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// Scenarios is the table, in the order the suite runs it. Models are a
// few MiB so the suite fits a CI job; links are shaped so a transfer lasts
// long enough to be cut in the middle.
func Scenarios() []Scenario {
	return []Scenario{
		{
			Name:   "origin-killed",
			Fault:  "the node furthest into its S3 reads (the origin of a shard) is killed with SIGKILL mid-transfer",
			Expect: "its shards move to the next node in rank; the survivors finish verified, reading the model from S3 about once (<= 1.1x)",
			Lab:    netlab.Options{Hosts: 3, Link: 200 * netlab.Mbit, S3Link: 100 * netlab.Mbit, S3: true},
			Run:    originKilled,
		},
		{
			Name:   "seeder-killed",
			Fault:  "a warm member serving a joining node is killed with SIGKILL while the joiner fills",
			Expect: "the joiner finishes verified from the other warm member, reading nothing from S3",
			Lab:    netlab.Options{Hosts: 3, Link: 200 * netlab.Mbit, S3: true},
			Run:    seederKilled,
		},
		{
			Name:   "fleet-restart",
			Fault:  "every node of a cold fleet is restarted a third of the way into the warm-up",
			Expect: "the fleet finishes verified and no node fetches a piece it had verified before the restart: the bytes it reads from S3 and peers after it are at most the model less those pieces",
			Lab:    netlab.Options{Hosts: 3, Link: 200 * netlab.Mbit, S3Link: 40 * netlab.Mbit, S3: true},
			Run:    fleetRestart,
		},
		{
			Name:   "publish-killed",
			Fault:  "the daemon is killed with SIGKILL during a download, from half way to the verification and publish, and restarted, six times",
			Expect: "what the killed daemon left is either not published or published whole, so is what it reports ready after the restart; each finishes verified",
			Lab:    netlab.Options{Hosts: 1, Link: 200 * netlab.Mbit, S3Link: 100 * netlab.Mbit, S3: true},
			Run:    publishKilled,
		},
		{
			Name:   "s3-overwrite",
			Fault:  "an object of the model is overwritten in S3 with other bytes while two nodes warm the model",
			Expect: "each node ends ready with one revision or the other, whole, never a mix of the two",
			Lab:    netlab.Options{Hosts: 2, Link: 200 * netlab.Mbit, S3Link: 40 * netlab.Mbit, S3: true},
			Run:    s3Overwrite,
		},
		{
			Name:   "keyless-host",
			Fault:  "a host with another cluster key joins the gossip and asks a member's peer port for a shard",
			Expect: "its join is refused (no member sees it, it sees only itself) and its handshake fails, counted in the member's warmfleet_peer_auth_failures_total",
			Lab:    netlab.Options{Hosts: 3, Link: 200 * netlab.Mbit, S3: true},
			Run:    keylessHost,
		},
		{
			Name:  "hostile-keys",
			Fault: "S3 listings hold keys with ../, absolute paths, backslashes, overlong segments, duplicates, a file that is also a directory, keys outside the prefix, and a continuation token that loops; real objects have Unicode look-alikes of dots and slashes in their names",
			Expect: "every hostile listing fails its cache with an error and nothing is written outside the data directory; " +
				"the look-alike model is cached verified, its files inside its directory",
			Lab: netlab.Options{Hosts: 1, Link: 200 * netlab.Mbit, S3: true, S3Front: hostileFront},
			Run: hostileKeys,
		},
		{
			Name:   "partition-heal",
			Fault:  "the fleet splits in two halves that cannot reach each other; each half is given a model of its own, then the network heals",
			Expect: "gossip converges (every node sees all four alive), the desired states merge with nothing lost (every node ends with both models verified), and S3 is not read again for what one half holds (<= 1.25x the two models, one shard of slack: more means nodes re-read the other half's model)",
			Lab:    netlab.Options{Hosts: 4, Link: 200 * netlab.Mbit, S3: true},
			Run:    partitionHeal,
		},
		{
			Name:  "clock-skew",
			Fault: "the nodes' wall clocks are off by 0, +5 min and -7 min, and a fourth node's by +3 h (a broken clock)",
			Expect: "the fleet warms; an edit made later on the node 7 minutes behind wins over the one from the node 5 minutes ahead on every node; " +
				"the broken clock's write is refused by the healthy nodes and counted (warmfleet_gossip_desired_refused_future_total), nothing else is lost",
			Lab: netlab.Options{Hosts: 4, Link: 200 * netlab.Mbit, S3: true},
			Run: clockSkew,
		},
		{
			Name: "router-rows",
			Fault: "the product's router in front of two llmsim engines gets malformed, oversize and chunked-oversize bodies; slowloris bodies on twice its slow-body slots; " +
				"every backend slot held by a stream and three times as many requests more; one engine SIGKILLed mid-stream; then two storms of 2000 concurrent connections (10k with --long)",
			Expect: "400/413 for bad bodies and 408 for every slow one within the body timeout while good requests are served; 429 (never a 5xx or a hang) past the limits; " +
				"the dead engine's streams cut without [DONE], the other's finish, the survivor takes the traffic; every storm answer a 200 or 429, " +
				"the router's goroutines back within " + fmt.Sprint(rowsGoroutineSlack) + " of idle after each storm and its memory within 64 KiB per connection of what it was before",
			Lab:     netlab.Options{Hosts: 4, Link: 1000 * netlab.Mbit},
			NoFiles: true,
			Run:     routerRows,
		},
		{
			Name:   "flapping-member",
			Fault:  "one node's link goes down and up every 2 s for 20 s (every 4 s for a minute with --long) while a cold fleet of three warms a model",
			Expect: "the fleet finishes verified without thrash: S3 is read about once (<= 1.25x the model), not once per flap, and no node pulls the model twice (S3 and peer bytes <= 1.25x each)",
			Lab:    netlab.Options{Hosts: 3, Link: 200 * netlab.Mbit, S3Link: 40 * netlab.Mbit, S3: true},
			Run:    flappingMember,
		},
		{
			Name:   "s3-storm",
			Fault:  "S3 answers GETs with 503 SlowDown and cuts response bodies mid-way (connection resets) during the warm-up",
			Expect: "the fleet backs off, retries and finishes verified; S3 sends at most 1.05x the model",
			Lab:    netlab.Options{Hosts: 2, Link: 200 * netlab.Mbit, S3: true, S3Front: faultFront},
			Run:    s3Storm,
		},
		{
			Name: "corrupting-peer",
			Fault: "a warm member serves corrupt piece bytes (a proxy in front of its peer port flips bits past the handshake; the fleet runs with --p2p-encrypt=false, " +
				"since under TLS the flipped bits end the connection before any piece is read), then comes back under another node name and ports",
			Expect: "a joining node detects the bad pieces, bans that member and fills verified from the honest one, reading nothing from S3; " +
				"the banned member, back under another node name and other ports, still gets no piece taken from it (the ban follows its identity key, kept in its data directory)",
			Lab: netlab.Options{Hosts: 3, Link: 400 * netlab.Mbit, S3: true},
			Run: corruptingPeer,
		},
		{
			Name:   "disk-full",
			Fault:  "one host's data disk is too small for the model",
			Expect: "that host reports not enough space with the bytes needed and free; the others finish verified",
			Lab:    netlab.Options{Hosts: 3, Link: 200 * netlab.Mbit, S3: true},
			Run:    diskFull,
		},
	}
}

// faultFront puts the S3 fault proxy in front of the lab's S3 server.
func faultFront(target string) (http.Handler, error) { return s3fault.New(target) }

func originKilled(ctx context.Context, f *Fleet) error {
	model, ds, err := f.Cold(ctx, "fault", 3, 3, 48<<20, 12)
	if err != nil {
		return err
	}
	var victim *netlab.Daemon
	err = wait.Until(ctx, func() error {
		for _, d := range ds {
			if s3, _, err := d.Metric(ctx, metricS3); err == nil && s3 >= 4<<20 {
				victim = d
				return nil
			}
		}
		return errors.New("no node has read 4 MiB from S3 yet")
	})
	if err != nil {
		return fmt.Errorf("an origin at work: %w", err)
	}
	if err := victim.Kill(); err != nil {
		return err
	}
	f.Log.Info("chaos: killed an origin mid-way", "host", victim.Host().Name)
	var survivors []*netlab.Daemon
	for _, d := range ds {
		if d != victim {
			survivors = append(survivors, d)
		}
	}
	if err := f.WaitReady(ctx, "fault", model, survivors...); err != nil {
		return err
	}
	s3, err := f.Sum(ctx, metricS3, survivors...)
	if err != nil {
		return err
	}
	// One survivor takes over each of the victim's shards; the others keep
	// following, so the survivors together still read the model about once.
	if size := float64(model.Size()); s3 > 1.1*size {
		return fmt.Errorf("survivors read %.2fx the model from S3, want about 1x", s3/size)
	}
	return nil
}

func seederKilled(ctx context.Context, f *Fleet) error {
	model, warm, err := f.Warm(ctx, "seed", 2, 2, 24<<20, 21)
	if err != nil {
		return err
	}
	// The joiner's slow link keeps its fill going long enough to kill a
	// seeder in the middle of it.
	h := f.Lab.Hosts()[2]
	if err := h.Link().Shape(ctx, 40*netlab.Mbit); err != nil {
		return err
	}
	joiner, err := f.Start(ctx, h, nil)
	if err != nil {
		return err
	}
	err = wait.Until(ctx, func() error {
		if in, _, err := joiner.Metric(ctx, metricPeerIn); err != nil || in < 4<<20 {
			return fmt.Errorf("joiner has %v bytes from peers (err %v)", in, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("the joiner filling: %w", err)
	}
	// Kill the seeder that has sent it the most.
	victim := warm[0]
	if a, b := outBytes(ctx, warm[0]), outBytes(ctx, warm[1]); b > a {
		victim = warm[1]
	}
	if err := victim.Kill(); err != nil {
		return err
	}
	f.Log.Info("chaos: killed a seeder mid-way", "host", victim.Host().Name)
	if err := joiner.WaitReady(ctx, "seed", model); err != nil {
		return err
	}
	if s3, err := joiner.MetricValue(ctx, metricS3); err != nil || s3 != 0 {
		return fmt.Errorf("joiner read %v bytes from S3 (err %v), want 0: the other seeder holds everything", s3, err)
	}
	return nil
}

func outBytes(ctx context.Context, d *netlab.Daemon) float64 {
	v, _, _ := d.Metric(ctx, `warmfleet_peer_bytes_total{direction="out"}`)
	return v
}

// restartFigures are one node's counters at the moment its run ended.
type restartFigures struct{ verified, s3, peerIn float64 }

func readFigures(ctx context.Context, d *netlab.Daemon) (restartFigures, error) {
	var r restartFigures
	var err error
	for _, m := range []struct {
		name string
		v    *float64
	}{{metricVerified, &r.verified}, {metricS3, &r.s3}, {metricPeerIn, &r.peerIn}} {
		if *m.v, err = d.MetricValue(ctx, m.name); err != nil {
			return r, err
		}
	}
	return r, nil
}

func fleetRestart(ctx context.Context, f *Fleet) error {
	const piece = 2 << 20 // the daemon's piece size
	model, ds, err := f.Cold(ctx, "restart", 3, 2, 12*piece, 31)
	if err != nil {
		return err
	}
	err = wait.Until(ctx, func() error {
		s3, err := f.Sum(ctx, metricS3, ds...)
		if err == nil && s3 < float64(model.Size())/3 {
			err = fmt.Errorf("the fleet has read %.0f bytes from S3", s3)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("a third of the warm-up: %w", err)
	}
	// Cut every link so no byte moves while the counters are read; the
	// daemons stop while cut, and start again with their links back.
	hosts := f.Lab.Hosts()
	for _, h := range hosts {
		if err := h.Link().Cut(ctx); err != nil {
			return err
		}
	}
	before := make([]restartFigures, len(ds))
	for i, d := range ds {
		if before[i], err = readFigures(ctx, d); err != nil {
			return err
		}
		if err := d.Stop(10 * time.Second); err != nil {
			f.Log.Info("chaos: stop", "host", d.Host().Name, "err", err)
		}
	}
	for _, h := range hosts {
		if err := h.Link().Restore(ctx); err != nil {
			return err
		}
	}
	// All at once, as after a power cut of the whole fleet.
	restarted := make([]error, len(ds))
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Go(func() { restarted[i] = d.Restart(ctx, 10*time.Second) })
	}
	wg.Wait()
	if err := errors.Join(restarted...); err != nil {
		return err
	}
	if err := f.WaitReady(ctx, "restart", model, ds...); err != nil {
		return err
	}
	var errs []error
	for i, d := range ds {
		after, err := readFigures(ctx, d)
		if err != nil {
			return err
		}
		b := before[i]
		f.Log.Info("chaos: restart figures", "host", d.Host().Name, "verified_before", b.verified, "verified_after", after.verified,
			"s3_before", b.s3, "s3_after", after.s3, "peer_before", b.peerIn, "peer_after", after.peerIn)
		if left, got := float64(model.Size())-b.verified*piece, after.s3+after.peerIn; got > left {
			errs = append(errs, fmt.Errorf("%s held %v verified pieces at the restart, then read %.0f bytes (%.0f from S3) where %.0f were missing: verified pieces fetched again",
				d.Host().Name, b.verified, got, after.s3, left))
		}
	}
	return errors.Join(errs...)
}

func s3Storm(ctx context.Context, f *Fleet) error {
	faults, ok := f.Lab.S3().Front.(*s3fault.Proxy)
	if !ok {
		return fmt.Errorf("lab's S3 front is %T, want the fault proxy", f.Lab.S3().Front)
	}
	// The daemons GET nothing before the cache is added (seeding goes
	// around the proxy), so the storm hits the warm-up.
	const slowDowns, resets = 8, 4
	faults.SlowDownGETs(slowDowns)
	faults.ResetAfter(64<<10, resets)
	model, ds, err := f.Cold(ctx, "storm", 2, 2, 16<<20, 41)
	if err != nil {
		return err
	}
	if err := f.WaitReady(ctx, "storm", model, ds...); err != nil {
		return err
	}
	st := faults.Stats()
	f.Log.Info("chaos: storm figures", "requests", st.Requests, "slowdowns", st.SlowDowns, "resets", st.Resets, "body_bytes", st.BodyBytes)
	if st.SlowDowns != slowDowns || st.Resets != resets {
		return fmt.Errorf("S3 answered %d SlowDowns and cut %d bodies, want %d and %d: the storm missed the warm-up", st.SlowDowns, st.Resets, slowDowns, resets)
	}
	if size := float64(model.Size()); float64(st.BodyBytes) > 1.05*size {
		return fmt.Errorf("S3 sent %.3fx the model, want <= 1.05x", float64(st.BodyBytes)/size)
	}
	return nil
}

func corruptingPeer(ctx context.Context, f *Fleet) error {
	model, err := f.Seed(ctx, "corrupt/", 2, 16<<20, 13)
	if err != nil {
		return err
	}
	hosts := f.Lab.Hosts()
	bad := hosts[0]
	// The bad member's daemon listens on 7948; members reach it through the
	// proxy on 7947, the address it advertises.
	proxy, err := bad.Proxy(bad.Addr(7947), bad.Addr(7948))
	if err != nil {
		return err
	}
	defer proxy.Close()
	badD, err := f.Start(ctx, bad, []string{"--p2p", bad.Addr(7948), "--p2p-advertise", bad.Addr(7947)}, plaintextP2P)
	if err != nil {
		return err
	}
	honest, err := f.Start(ctx, hosts[1], nil, plaintextP2P)
	if err != nil {
		return err
	}
	if err := honest.WaitMembers(ctx, 2); err != nil {
		return err
	}
	if err := f.Add(ctx, honest, "corrupt", model); err != nil {
		return err
	}
	if err := f.WaitReady(ctx, "corrupt", model, badD, honest); err != nil {
		return err
	}
	// From now on the bad member's piece bytes are corrupt.
	proxy.SetMangle(flipBits)
	joiner, err := f.Start(ctx, hosts[2], nil, plaintextP2P)
	if err != nil {
		return err
	}
	if err := joiner.WaitReady(ctx, "corrupt", model); err != nil {
		return err
	}
	var v [3]float64
	for i, name := range []string{metricBanned, metricFailed, metricS3} {
		if v[i], err = joiner.MetricValue(ctx, name); err != nil {
			return err
		}
	}
	banned, failed, s3 := v[0], v[1], v[2]
	f.Log.Info("chaos: joiner figures", "banned", banned, "failed", failed, "s3", s3)
	f.Figure("bans", banned)
	f.Figure("bad_pieces", failed)
	if failed < 1 || banned < 1 {
		return fmt.Errorf("corrupt pieces went unnoticed: %v failed, %v bans", failed, banned)
	}
	if s3 != 0 {
		return fmt.Errorf("joiner read %v bytes from S3; the honest member holds everything", s3)
	}
	return comesBackRenamed(ctx, f, badD, honest, joiner, failed)
}

// comesBackRenamed restarts the banned member under another node name, on
// other gossip and peer ports, still corrupting, and has it warm a second
// model with the honest member while the joiner is cut off; then the joiner
// fills that model and must not take one piece from it: the ban follows
// the identity key it proves (the same data directory), not the name it
// gives.
func comesBackRenamed(ctx context.Context, f *Fleet, badD, honest, joiner *netlab.Daemon, failedBefore float64) error {
	model, err := f.Seed(ctx, "corrupt2/", 2, 8<<20, 14)
	if err != nil {
		return err
	}
	bad := badD.Host()
	if err := badD.Stop(10 * time.Second); err != nil {
		return err
	}
	proxy, err := bad.Proxy(bad.Addr(7957), bad.Addr(7958))
	if err != nil {
		return err
	}
	defer proxy.Close()
	proxy.SetMangle(flipBits)
	link := joiner.Host().Link()
	if err := link.Cut(ctx); err != nil {
		return err
	}
	renamed, err := f.Start(ctx, bad, []string{"--p2p", bad.Addr(7958), "--p2p-advertise", bad.Addr(7957)},
		plaintextP2P, "--node-name", bad.Name+"-renamed", "--gossip", bad.Addr(7956), "--join", honest.Host().Addr(7946))
	if err != nil {
		return errors.Join(err, link.Restore(ctx))
	}
	if err := f.Add(ctx, honest, "corrupt2", model); err != nil {
		return errors.Join(err, link.Restore(ctx))
	}
	err = f.WaitReady(ctx, "corrupt2", model, honest, renamed)
	if rerr := link.Restore(ctx); err != nil || rerr != nil {
		return errors.Join(err, rerr)
	}
	f.Log.Info("chaos: the banned member is back under a new name and ports", "name", bad.Name+"-renamed")
	if err := joiner.WaitReady(ctx, "corrupt2", model); err != nil {
		return err
	}
	failed, err := joiner.MetricValue(ctx, metricFailed)
	if err != nil {
		return err
	}
	f.Figure("bad_pieces_after_rename", failed-failedBefore)
	if failed != failedBefore {
		return fmt.Errorf("the joiner took %v bad pieces from the banned member back under a new name and port", failed-failedBefore)
	}
	return nil
}

// plaintextP2P runs a daemon's peer connections without TLS, so that bytes
// altered on the path reach piece verification (under TLS they end the
// connection instead).
const plaintextP2P = "--p2p-encrypt=false"

// flipBits flips every 256 KiB-th byte a member sends past its first 64
// KiB: handshakes and bitfields pass, piece bytes do not.
func flipBits(off int64, p []byte) {
	for i := range p {
		if o := off + int64(i); o >= 64<<10 && o%(256<<10) == 0 {
			p[i] ^= 0x01
		}
	}
}

// noSpace is the daemon's report of a cache that does not fit, with its
// figures.
var noSpace = regexp.MustCompile(`insufficient space: need [0-9.]+ ?[KMGT]?i?B, [0-9.]+ ?[KMGT]?i?B free`)

func diskFull(ctx context.Context, f *Fleet) error {
	small := f.Lab.Hosts()[2]
	if err := small.LimitDisk(8 << 20); err != nil {
		return err
	}
	model, ds, err := f.Cold(ctx, "full", 3, 2, 24<<20, 51)
	if err != nil {
		return err
	}
	err = wait.Until(ctx, func() error {
		st, err := ds[2].CacheStatus(ctx, "full")
		if err != nil {
			return err
		}
		if !noSpace.MatchString(st.Error) {
			return fmt.Errorf("%s: state %s, error %q", small.Name, st.State, st.Error)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("the small host reporting no space with figures: %w", err)
	}
	return f.WaitReady(ctx, "full", model, ds[:2]...)
}

// killPoints are where publishKilled kills the daemon, one a round: half
// way, the final writes, the last byte written, and the verification that
// leads to the publish. The verification of a small model can end between
// two scrapes: the last point then kills the daemon just after the publish,
// which must have left the revision whole as well.
var killPoints = []struct {
	name    string
	reached func(done float64, verifying, ready bool) bool
}{
	{"half written", func(done float64, verifying, _ bool) bool { return done >= 0.5 || verifying }},
	{"seven eighths written", func(done float64, verifying, _ bool) bool { return done >= 7.0/8 || verifying }},
	{"every byte written", func(done float64, verifying, _ bool) bool { return done >= 1 || verifying }},
	{"verifying", func(_ float64, verifying, ready bool) bool { return verifying || ready }},
}

func publishKilled(ctx context.Context, f *Fleet) error {
	d, err := f.Start(ctx, f.Lab.Hosts()[0], nil)
	if err != nil {
		return err
	}
	const rounds = 6
	var models []netlab.Model
	for i := range rounds {
		m, err := f.Seed(ctx, fmt.Sprintf("pub%d/", i), 4, 6<<20, uint64(60+i))
		if err != nil {
			return err
		}
		models = append(models, m)
	}
	landed := 0
	for i, m := range models {
		name := fmt.Sprintf("pub%d", i)
		if err := f.Add(ctx, d, name, m); err != nil {
			return err
		}
		at := killPoints[i%len(killPoints)]
		err := wait.Until(ctx, func() error {
			text, err := d.Metrics(ctx)
			if err != nil {
				return err
			}
			done, _, err := netlab.MetricSum(text, fmt.Sprintf("warmfleet_cache_bytes{model=%q}", name))
			if err != nil {
				return err
			}
			verifying, _, err := netlab.MetricSum(text, fmt.Sprintf(`warmfleet_cache_state{model=%q,state="verifying"}`, name))
			if err != nil {
				return err
			}
			ready, _, err := netlab.MetricSum(text, fmt.Sprintf(`warmfleet_cache_state{model=%q,state="ready"}`, name))
			if err != nil {
				return err
			}
			if !at.reached(done/float64(m.Size()), verifying == 1, ready == 1) {
				return fmt.Errorf("%s: %v of %d bytes, verifying %v", at.name, done, m.Size(), verifying)
			}
			return nil
		}, wait.MaxInterval(time.Millisecond))
		if err != nil {
			return fmt.Errorf("%s near its end: %w", name, err)
		}
		if err := d.Kill(); err != nil {
			return err
		}
		// What the dead daemon left: published (and then whole) or not.
		switch dir, err := filepath.EvalSymlinks(filepath.Join(d.Host().DataDir, "models", name, "current")); {
		case errors.Is(err, fs.ErrNotExist):
			landed++
		case err != nil:
			return err
		default:
			if _, bad, err := checkDir(dir, models[i:i+1]); bad > 0 {
				return fmt.Errorf("%s published with %d bad files when the daemon was killed: %w", name, bad, err)
			}
		}
		if err := d.Restart(ctx, 10*time.Second); err != nil {
			return err
		}
		// Right after the restart, whatever is ready must be whole.
		for j := range i + 1 {
			st, err := d.CacheStatus(ctx, fmt.Sprintf("pub%d", j))
			if err != nil || !st.Ready {
				continue
			}
			if _, bad, err := checkDir(st.Path, models[j:j+1]); bad > 0 {
				return fmt.Errorf("pub%d ready after a SIGKILL with %d bad files: %w", j, bad, err)
			}
		}
		if err := d.WaitReady(ctx, name, m); err != nil {
			return err
		}
		// The link the kill check looks for is where ready models are.
		if _, err := os.Stat(filepath.Join(d.Host().DataDir, "models", name, "current")); err != nil {
			return fmt.Errorf("%s ready without its current link: %w", name, err)
		}
	}
	f.Log.Info("chaos: publish kills", "kills", rounds, "before_ready", landed)
	if landed == 0 {
		return fmt.Errorf("none of %d kills landed before ready: the scenario tested nothing", rounds)
	}
	return nil
}

func s3Overwrite(ctx context.Context, f *Fleet) error {
	before, err := f.Seed(ctx, "over/", 2, 24<<20, 71)
	if err != nil {
		return err
	}
	// The second revision differs in its second file only, so S3 never
	// holds a state that is neither revision.
	body := make([]byte, before.Files[1].Size)
	_, _ = rand.NewChaCha8([32]byte{72}).Read(body)
	sum := sha256.Sum256(body)
	after := netlab.Model{Bucket: before.Bucket, Prefix: before.Prefix, Files: slices.Clone(before.Files)}
	after.Files[1].SHA256 = hex.EncodeToString(sum[:])
	ds, err := f.StartFleet(ctx, 2)
	if err != nil {
		return err
	}
	if err := f.Add(ctx, ds[0], "over", before, after); err != nil {
		return err
	}
	err = wait.Until(ctx, func() error {
		done, err := f.Sum(ctx, metricS3, ds...)
		// Early, so the overwrite falls inside the second file's
		// transfer (the S3 link takes seconds over the model).
		if err == nil && done < 1<<20 {
			err = fmt.Errorf("the nodes have read %v bytes from S3", done)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("the warm-up under way: %w", err)
	}
	key := before.Prefix + before.Files[1].Name
	if err := f.Lab.S3().Put(ctx, before.Bucket, key, bytes.NewReader(body), int64(len(body))); err != nil {
		return err
	}
	f.Log.Info("chaos: object overwritten", "key", key)
	for _, d := range ds {
		err := wait.Until(ctx, func() error {
			st, err := d.CacheStatus(ctx, "over")
			if err == nil && !st.Ready {
				err = fmt.Errorf("%s: state %s %s", d.Host().Name, st.State, st.Error)
			}
			return err
		})
		if err != nil {
			return err
		}
		st, err := d.CacheStatus(ctx, "over")
		if err != nil {
			return err
		}
		// The shared checks hold the directory to one revision, whole.
		which := "the first"
		if after.Verify(st.Path) == nil {
			which = "the second"
		}
		f.Log.Info("chaos: ready after the overwrite", "host", d.Host().Name, "revision", which)
	}
	return nil
}

func keylessHost(ctx context.Context, f *Fleet) error {
	_, ds, err := f.Warm(ctx, "keyed", 2, 2, 8<<20, 81)
	if err != nil {
		return err
	}
	h := f.Lab.Hosts()[2]
	otherKey := filepath.Join(filepath.Dir(f.Key), "other.key")
	if err := netlab.WriteClusterKey(otherKey); err != nil {
		return err
	}
	intruder, err := h.StartDaemon(ctx, netlab.DaemonSpec{Bin: f.Bin, Env: f.Lab.S3().Env(), Args: netlab.SwarmArgs(h, f.seedHost(), otherKey)})
	if err != nil {
		return err
	}
	f.outsiders = append(f.outsiders, intruder)
	err = wait.Until(ctx, func() error {
		if !strings.Contains(intruder.Log(), "gossip: join failed") {
			return errors.New("the intruder's join has not failed yet")
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, d := range append(ds, intruder) {
		ms, err := d.FleetView(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if (m.Name == h.Name) != (d == intruder) && m.State == "alive" {
				return fmt.Errorf("%s sees %s alive: the key did not separate them", d.Host().Name, m.Name)
			}
		}
	}
	// Ask a member for a shard as the swarm does, with the wrong key.
	before, err := ds[0].MetricValue(ctx, metricAuthFail)
	if err != nil {
		return err
	}
	key := make([]byte, 32)
	_, _ = cryptorand.Read(key)
	node, err := p2p.NewNode(p2p.Config{NodeID: h.Name, ClusterKey: key})
	if err != nil {
		return err
	}
	var fetchErr error
	if err := h.NS.Do(func() error {
		_, fetchErr = node.FetchManifest(ctx, ds[0].Host().Addr(7947), "keyed-shard")
		return nil
	}); err != nil {
		return err
	}
	if fetchErr == nil {
		return errors.New("a member gave a manifest to a peer with another key")
	}
	return wait.Until(ctx, func() error {
		after, err := ds[0].MetricValue(ctx, metricAuthFail)
		if err == nil && after <= before {
			err = fmt.Errorf("%s counts %v auth failures, as before the stranger asked (%v); its answer was %v", ds[0].Host().Name, after, before, fetchErr)
		}
		return err
	})
}

// hostileListings are the cases of hostileKeys, by cache name; each key
// that lands somewhere is named escape-*, so a stray file is found.
func hostileListings() map[string]hostileListing {
	long := strings.Repeat("escape-long-", 30)
	listing := func(name string, keys ...string) hostileListing {
		l := hostileListing{Keys: []string{name + "/model.safetensors"}}
		for _, k := range keys {
			l.Keys = append(l.Keys, name+"/"+k)
		}
		return l
	}
	return map[string]hostileListing{
		"dotdot":    listing("dotdot", "../escape-dotdot"),
		"deep":      listing("deep", "a/../../../escape-deep"),
		"absolute":  listing("absolute", "/tmp/escape-absolute"),
		"backslash": listing("backslash", `..\escape-backslash`),
		"long":      listing("long", long),
		"duplicate": listing("duplicate", "model.safetensors"),
		"clash":     listing("clash", "model.safetensors/escape-clash"),
		"outside":   {Keys: []string{"outside/model.safetensors", "elsewhere/escape-outside"}},
		"loop":      {Keys: []string{"loop/model.safetensors"}, Loop: true},
	}
}

func hostileKeys(ctx context.Context, f *Fleet) error {
	front, ok := f.Lab.S3().Front.(*hostileS3)
	if !ok {
		return fmt.Errorf("lab's S3 front is %T, want the hostile listing front", f.Lab.S3().Front)
	}
	// Real objects whose names only look like dots and slashes.
	s3h := f.Lab.S3()
	if err := s3h.MakeBucket(ctx, "models"); err != nil {
		return err
	}
	look := netlab.Model{Bucket: "models", Prefix: "lookalike/"}
	for i, name := range []string{"\u2024\u2024/escape-lookalike-dots.safetensors", "a\u2215escape-lookalike-slash.safetensors", "\uff0e\uff0e\uff0fescape-lookalike-fullwidth"} {
		body := make([]byte, 1<<20+i)
		_, _ = rand.NewChaCha8([32]byte{90, byte(i)}).Read(body)
		if err := s3h.Put(ctx, look.Bucket, look.Prefix+name, bytes.NewReader(body), int64(len(body))); err != nil {
			return fmt.Errorf("put %q: %w", name, err)
		}
		sum := sha256.Sum256(body)
		look.Files = append(look.Files, netlab.ModelFile{Name: name, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])})
	}
	d, err := f.Start(ctx, f.Lab.Hosts()[0], nil)
	if err != nil {
		return err
	}
	cases := hostileListings()
	for name, l := range cases {
		front.set(name+"/", l)
		if err := f.Add(ctx, d, name, netlab.Model{Bucket: "models", Prefix: name + "/"}); err != nil {
			return err
		}
	}
	if err := f.Add(ctx, d, "lookalike", look); err != nil {
		return err
	}
	var errs []error
	for name := range cases {
		err := wait.Until(ctx, func() error {
			st, err := d.CacheStatus(ctx, name)
			if err != nil {
				return err
			}
			if st.State != "failed" || st.Error == "" {
				return fmt.Errorf("%s: state %s, error %q; want failed with the reason", name, st.State, st.Error)
			}
			f.Log.Info("chaos: hostile listing refused", "cache", name, "error", st.Error)
			return nil
		})
		errs = append(errs, err)
	}
	if err := d.WaitReady(ctx, "lookalike", look); err != nil {
		errs = append(errs, err)
	}
	if n := front.listingsServed(); n < len(cases) {
		errs = append(errs, fmt.Errorf("the front answered %d hostile listings, want at least %d", n, len(cases)))
	}
	errs = append(errs, strayFiles(f, d, look))
	return errors.Join(errs...)
}

// strayFiles fails on any escape-* file in the lab outside the S3 host's
// buckets and the look-alike model's ready directory.
func strayFiles(f *Fleet, d *netlab.Daemon, look netlab.Model) error {
	st, err := d.CacheStatus(context.Background(), "lookalike")
	if err != nil {
		return err
	}
	var stray []string
	walkErr := filepath.WalkDir(f.Lab.Dir(), func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && path == f.Lab.S3().Dir {
			return filepath.SkipDir
		}
		if !e.IsDir() && strings.Contains(e.Name(), "escape-") && !strings.HasPrefix(path, st.Path+string(filepath.Separator)) {
			stray = append(stray, path)
		}
		return nil
	})
	// Keys tried to reach /tmp and the lab's parent too.
	for _, p := range []string{"/tmp/escape-absolute", filepath.Join(filepath.Dir(f.Lab.Dir()), "escape-dotdot")} {
		if _, err := os.Lstat(p); err == nil {
			stray = append(stray, p)
		}
	}
	if len(stray) > 0 {
		return fmt.Errorf("files written outside their cache: %v", stray)
	}
	return walkErr
}

// partition makes every host of a unreachable from every host of b and
// back, with blackhole routes in their namespaces; heal is its undo.
func partition(ctx context.Context, a, b []*netlab.Host, heal bool) error {
	op := "add"
	if heal {
		op = "del"
	}
	for _, pair := range [][2][]*netlab.Host{{a, b}, {b, a}} {
		for _, from := range pair[0] {
			for _, to := range pair[1] {
				out, err := from.Command(ctx, "ip", "route", op, "blackhole", to.IP.String()+"/32").CombinedOutput()
				if err != nil {
					return fmt.Errorf("route %s blackhole %s on %s: %w: %s", op, to.IP, from.Name, err, out)
				}
			}
		}
	}
	return nil
}

func partitionHeal(ctx context.Context, f *Fleet) error {
	left, err := f.Seed(ctx, "left/", 2, 8<<20, 91)
	if err != nil {
		return err
	}
	right, err := f.Seed(ctx, "right/", 2, 8<<20, 92)
	if err != nil {
		return err
	}
	ds, err := f.StartFleet(ctx, 4)
	if err != nil {
		return err
	}
	hosts := f.Lab.Hosts()
	if err := partition(ctx, hosts[:2], hosts[2:], false); err != nil {
		return err
	}
	for _, d := range []*netlab.Daemon{ds[0], ds[2]} {
		if err := d.WaitMembers(ctx, 2); err != nil {
			return fmt.Errorf("the partition seen: %w", err)
		}
	}
	if err := f.Add(ctx, ds[0], "left", left); err != nil {
		return err
	}
	if err := f.Add(ctx, ds[2], "right", right); err != nil {
		return err
	}
	if err := f.WaitReady(ctx, "left", left, ds[:2]...); err != nil {
		return err
	}
	if err := f.WaitReady(ctx, "right", right, ds[2:]...); err != nil {
		return err
	}
	if err := partition(ctx, hosts[:2], hosts[2:], true); err != nil {
		return err
	}
	f.Log.Info("chaos: partition healed")
	for _, d := range ds {
		if err := d.WaitMembers(ctx, 4); err != nil {
			return fmt.Errorf("gossip converging after the heal: %w", err)
		}
	}
	if err := f.WaitReady(ctx, "left", left, ds...); err != nil {
		return err
	}
	if err := f.WaitReady(ctx, "right", right, ds...); err != nil {
		return err
	}
	s3, err := f.Sum(ctx, metricS3, ds...)
	if err != nil {
		return err
	}
	size := float64(left.Size() + right.Size())
	f.Log.Info("chaos: partition figures", "s3_ratio", s3/size)
	if s3 > 1.25*size {
		return fmt.Errorf("the fleet read %.2fx the two models from S3, want at most 1.25x: the halves did not fill each other", s3/size)
	}
	return nil
}

func flappingMember(ctx context.Context, f *Fleet) error {
	model, ds, err := f.Cold(ctx, "flap", 3, 2, 24<<20, 101)
	if err != nil {
		return err
	}
	link := f.Lab.Hosts()[2].Link()
	// The fault's schedule: ten down-and-up cycles of 2 s; the long
	// variant, fifteen of 4 s (a minute).
	half, cycles := time.Second, 10
	if f.Long {
		half, cycles = 2*time.Second, 15
	}
	tick := time.NewTicker(half)
	defer tick.Stop()
	flaps := 0
	for down := true; flaps < cycles; down = !down {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if down {
			err = link.Cut(ctx)
		} else {
			err, flaps = link.Restore(ctx), flaps+1
		}
		if err != nil {
			return err
		}
	}
	if err := f.WaitReady(ctx, "flap", model, ds...); err != nil {
		return err
	}
	s3, err := f.Sum(ctx, metricS3, ds...)
	if err != nil {
		return err
	}
	size := float64(model.Size())
	f.Log.Info("chaos: flapping figures", "flaps", flaps, "s3_ratio", s3/size)
	f.Figure("flaps", float64(flaps))
	f.Figure("s3_ratio", s3/size)
	if s3 > 1.25*size {
		return fmt.Errorf("the fleet read %.2fx the model from S3 with a flapping member, want about 1x: pulls repeated", s3/size)
	}
	// No node pulls the model twice: what each read from S3 and peers
	// together stays about one model.
	var errs []error
	for _, d := range ds {
		got, err := f.Sum(ctx, metricS3, d)
		if err == nil {
			var in float64
			in, err = d.MetricValue(ctx, metricPeerIn)
			got += in
		}
		if err != nil {
			return err
		}
		f.Figure("pulled_ratio_"+d.Host().Name, got/size)
		if got > 1.25*size {
			errs = append(errs, fmt.Errorf("%s pulled %.2fx the model (S3 and peers) with a flapping member: pulls repeated", d.Host().Name, got/size))
		}
	}
	return errors.Join(errs...)
}
