package cli

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"go.uber.org/goleak"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// leakOptions ignores the goroutines that are not the code's: the test
// framework's, which goleak knows itself, and the ones below.
func leakOptions() []goleak.Option {
	return []goleak.Option{
		// A test's t.Context cancel watcher, started by the testing package
		// for tests that ask for t.Context (wait does); not the code's.
		goleak.IgnoreAnyFunction("testing.(*T).Context.func1"),
	}
}

// checkNoGoroutines fails t if a goroutine is left once the roots under
// test returned. A goroutine of this module blocked on anything must be
// gone at once: the root waits for every part. One that is runnable may be
// on its way out (a deferred WaitGroup.Done lets the root return while the
// goroutine still unwinds), and libraries' goroutines may take a moment
// more (memberlist's Shutdown does not wait for a probe in flight, which
// ends at its timeout), so the check for every goroutine polls.
func checkNoGoroutines(t *testing.T) {
	t.Helper()
	if left := ourGoroutines(); len(left) > 0 {
		t.Errorf("%d goroutines of this module left after the stop:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	wait.Err(t, "every goroutine ended", func() error { return goleak.Find(leakOptions()...) }, wait.Timeout(10*time.Second))
}

// ourGoroutines lists the goroutines, other than tests', with this
// module's code on their stack or started by it.
func ourGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		_, frames, _ := strings.Cut(g, "\n")
		if strings.HasPrefix(frames, "runtime.goexit1(") {
			continue // returned: only unwinding (a test's goroutine that ran a root)
		}
		if state := goroutineState(g); state == "runnable" || state == "running" {
			continue // not blocked: possibly unwinding; the poll covers it
		}
		if strings.Contains(g, "github.com/warmfleet/warmfleet/") && !strings.Contains(g, "testing.tRunner") {
			out = append(out, g)
		}
	}
	return out
}

// goroutineState is the state in a goroutine's header, "goroutine 7
// [chan receive, 2 minutes]:", without its duration or lock note.
func goroutineState(g string) string {
	_, state, _ := strings.Cut(g, "[")
	state, _, _ = strings.Cut(state, "]")
	state, _, _ = strings.Cut(state, ",")
	return state
}

// fleetDaemon is one in-process daemon of a test fleet.
type fleetDaemon struct {
	name string
	log  *syncBuffer
	stop context.CancelFunc
	done chan error
}

// metrics scrapes the daemon's metrics listener, whose address it logged.
func (fd *fleetDaemon) metrics(t *testing.T) string {
	t.Helper()
	_, rest, ok := strings.Cut(fd.log.String(), "msg=\"metrics listener\" addr=")
	if !ok {
		t.Fatalf("daemon %s did not log its metrics address", fd.name)
	}
	addr, _, _ := strings.Cut(rest, "\n")
	// No keep-alive: an idle connection would be a goroutine left over.
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// startFleetDaemon runs a daemon with gossip, a swarm listener and a
// metrics listener, and returns once its API listens. The S3 origin is
// never asked: the fleet wants no models.
func startFleetDaemon(t *testing.T, name, gossipAddr, keyFile string, join ...string) *fleetDaemon {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	fd := &fleetDaemon{name: name, log: &syncBuffer{}, stop: stop, done: make(chan error, 1)}
	args := []string{
		"--node-name", name, "--data-dir", t.TempDir(), "--api", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--reserve", "0", "--reserve-fraction", "0", "--containerd", "off",
		"--gossip", gossipAddr, "--cluster-key-file", keyFile, "--p2p", "127.0.0.1:0",
	}
	for _, j := range join {
		args = append(args, "--join", j)
	}
	origin := s3origin.Options{Endpoint: "http://127.0.0.1:9", Region: "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("unused", "unused", "")}
	started := make(chan struct{})
	env := &Env{Stdout: fd.log, Stderr: fd.log, Getenv: func(string) string { return "" }}
	go func() { fd.done <- ServeDaemon(ctx, env, args, origin, func() { close(started) }) }()
	select {
	case <-started:
	case err := <-fd.done:
		stop()
		t.Fatalf("daemon %s: %v", name, err)
	}
	return fd
}

// TestFleetStopsCleanly stops a whole fleet of two daemons at once, as a
// SIGTERM to every node does: each returns, leaves no goroutine behind and
// logs one line for the stop.
func TestFleetStopsCleanly(t *testing.T) {
	_, keyFile := clusterKeyFile(t)
	gossipA := testenv.FreeAddr(t)
	a := startFleetDaemon(t, "a", gossipA, keyFile)
	b := startFleetDaemon(t, "b", testenv.FreeAddr(t), keyFile, gossipA)
	fleet := []*fleetDaemon{a, b}
	for _, fd := range fleet {
		wait.For(t, fd.name+" sees the other member", func() bool {
			return strings.Contains(fd.metrics(t), `warmfleet_gossip_members{state="alive"} 2`)
		})
	}
	before := map[string]int{}
	for _, fd := range fleet {
		before[fd.name] = len(fd.log.String())
	}
	for _, fd := range fleet {
		fd.stop()
	}
	for _, fd := range fleet {
		if err := <-fd.done; err != nil {
			t.Errorf("daemon %s: %v", fd.name, err)
		}
	}
	checkNoGoroutines(t)
	for _, fd := range fleet {
		stopLog := fd.log.String()[before[fd.name]:]
		lines := slices.DeleteFunc(strings.Split(stopLog, "\n"), func(s string) bool { return s == "" })
		if len(lines) != 1 || !strings.Contains(lines[0], "warmfleet daemon stopped") {
			t.Errorf("daemon %s logged %d lines at a clean stop, want the one that says it stopped:\n%s", fd.name, len(lines), stopLog)
		}
	}
}

// TestPartFailureStopsAll fails one part (the API server loses its
// listener): every part is stopped, stage by stage, and Wait returns the
// failure with the part's name.
func TestPartFailureStopsAll(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions()...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ps := newParts(context.Background())
	var mu sync.Mutex
	var stopped []string
	waiter := func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			<-ctx.Done()
			mu.Lock()
			defer mu.Unlock()
			stopped = append(stopped, name)
			return nil
		}
	}
	// Started out of stage order: the stop order follows the stages.
	ps.start(stageSwarm, "swarm", waiter("swarm"), nil)
	ps.start(stageGossip, "gossip", waiter("gossip"), nil)
	ps.start(stageReconciler, "reconciler", waiter("reconciler"), nil)
	srv := &http.Server{}
	ps.start(stageListeners, "api server", serveHTTP(srv, ln), shutdownHTTP(srv, 0, nil))
	ps.start(stageListeners, "metrics", waiter("metrics"), nil)
	ln.Close() // Serve fails: not a Shutdown
	err = ps.Wait()
	if err == nil || !strings.HasPrefix(err.Error(), "api server: ") || errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Wait = %v, want the api server's failure", err)
	}
	if want := []string{"metrics", "reconciler", "gossip", "swarm"}; !slices.Equal(stopped, want) {
		t.Errorf("stopped %v, want %v", stopped, want)
	}
}

// TestRoutersStopCleanly runs two routers that gossip, watch the fleet and
// stream to each other over a peer link, each with an admin listener, and
// stops both at once: each returns and no goroutine is left. One follows
// its backend's KV events by connecting (to nobody: it keeps retrying),
// the other by binding.
func TestRoutersStopCleanly(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "hash.key")
	if err := os.WriteFile(keyFile, []byte("fleet secret for prompt hashes"), 0o600); err != nil {
		t.Fatal(err)
	}
	gossipA, peerA, peerB := testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t)
	type replica struct {
		log  *syncBuffer
		stop context.CancelFunc
		done chan error
	}
	start := func(name, gossipAddr, peerListen, peerTo, kvEvents string) *replica {
		ctx, stop := context.WithCancel(context.Background())
		r := &replica{log: &syncBuffer{}, stop: stop, done: make(chan error, 1)}
		args := []string{"--listen", "127.0.0.1:0", "--admin-listen", testenv.FreeAddr(t), "--node-name", name,
			"--hash-key-file", keyFile, "--gossip", gossipAddr, "--join", gossipA, "--insecure-gossip",
			"--peer-listen", peerListen, "--peer", "http://" + peerTo, "--backend", "http://127.0.0.1:9", "--kv-events", "http://127.0.0.1:9=" + kvEvents}
		env := &Env{Stdout: r.log, Stderr: r.log, Getenv: func(string) string { return "" }}
		go func() { r.done <- serveRouter(ctx, env, args, nil) }()
		return r
	}
	routers := []*replica{start("ra", gossipA, peerA, peerB, "tcp://"+testenv.FreeAddr(t)),
		start("rb", testenv.FreeAddr(t), peerB, peerA, "bind:tcp://127.0.0.1:0")}
	for _, r := range routers {
		wait.For(t, "the routers stream to each other", func() bool { return strings.Contains(r.log.String(), "peer stream open") })
	}
	for _, r := range routers {
		r.stop()
	}
	for _, r := range routers {
		if err := <-r.done; err != nil {
			t.Errorf("router: %v\n%s", err, r.log.String())
		}
	}
	checkNoGoroutines(t)
}

func TestLeaveWait(t *testing.T) {
	self := gossip.Member{Name: "a", Self: true, State: gossip.MemberAlive}
	for _, c := range []struct {
		name    string
		members []gossip.Member
		want    time.Duration
	}{
		{"alone", []gossip.Member{self}, time.Millisecond},
		{"every other member gone", []gossip.Member{self, {Name: "b", State: gossip.MemberDead}, {Name: "c", State: gossip.MemberLeft}}, time.Millisecond},
		{"another member alive", []gossip.Member{self, {Name: "b", State: gossip.MemberDead}, {Name: "c", State: gossip.MemberAlive}}, leaveTimeout},
	} {
		if got := leaveWait(c.members); got != c.want {
			t.Errorf("%s: leaveWait = %v, want %v", c.name, got, c.want)
		}
	}
}
