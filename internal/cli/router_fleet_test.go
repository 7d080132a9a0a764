package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/router"
)

// runInBackground runs a long-running command until the test ends.
func runInBackground(t *testing.T, args ...string) *syncBuffer {
	t.Helper()
	return runInBackgroundEnv(t, os.Getenv, args...)
}

// runInBackgroundEnv is runInBackground with the environment getenv
// reads; the test fails if the command exits non-zero when stopped.
func runInBackgroundEnv(t *testing.T, getenv func(string) string, args ...string) *syncBuffer {
	t.Helper()
	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	exited := make(chan int, 1)
	go func() {
		exited <- Run(ctx, args, &Env{Stdout: out, Stderr: out, Getenv: getenv})
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-exited; code != 0 {
			t.Errorf("warmfleet %s exited %d: %s", args[0], code, out.String())
		}
	})
	return out
}

// TestRouterLearnsWarmEndpointsFromFleet joins a router to a daemon's
// gossip cluster: the endpoint registered on the node gets traffic only
// once the node has the endpoint's model ready, and the router weighs it
// by the speed it was registered with.
func TestRouterLearnsWarmEndpointsFromFleet(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	s3.PutObject(t, "models", "sim/weights.safetensors", strings.NewReader("weights"), 7)

	dir := t.TempDir()
	sock := "unix://" + filepath.Join(dir, "api.sock")
	gossipAddr := testenv.FreeAddr(t)
	runInBackground(t, "daemon", "--data-dir", filepath.Join(dir, "data"), "--api", sock, "--node-name", "n1",
		"--gossip", gossipAddr, "--insecure-gossip", "--reserve", "0", "--reserve-fraction", "0", "--containerd", "off")
	simAddr := testenv.FreeAddr(t)
	startSim(t, simAddr, "sim")
	routerAddr := testenv.FreeAddr(t)
	adminAddr := testenv.FreeAddr(t)
	routerLog := runInBackground(t, "router", "--listen", routerAddr, "--admin-listen", adminAddr, "--join", gossipAddr,
		"--gossip", testenv.FreeAddr(t), "--insecure-gossip", "--node-name", "r1")

	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		wait.Err(t, what, func() error {
			if cond() {
				return nil
			}
			return fmt.Errorf("not yet; router log:\n%s", routerLog.String())
		})
	}
	cli := func(args ...string) int {
		var out bytes.Buffer
		return Run(t.Context(), append(args, "--api", sock), &Env{Stdout: &out, Stderr: &out, Getenv: os.Getenv})
	}
	waitUntil("daemon API", func() bool { return cli("cache", "ls") == 0 })
	if code := cli("endpoint", "add", "--model", "sim", "--url", "http://"+simAddr, "--speed", "2"); code != 0 {
		t.Fatalf("endpoint add exited %d", code)
	}
	complete := func() (int, string) { return complete(routerAddr, "sim") }
	// Not cached yet: the endpoint is known but gets no traffic.
	waitUntil("router up", func() bool { code, _ := complete(); return code != 0 })
	if code, body := complete(); code == http.StatusOK {
		t.Fatalf("request routed to a node whose model is not ready: %s", body)
	}
	if code := cli("cache", "add", "sim", "--source", "s3://models/sim/", "--wait", "--timeout", "60s"); code != 0 {
		t.Fatalf("cache add exited %d", code)
	}
	waitUntil("request served through the warm endpoint", func() bool { code, _ := complete(); return code == http.StatusOK })
	resp, err := http.Get("http://" + adminAddr + "/admin/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st router.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Backends) != 1 || st.Backends[0].Speed != 2 {
		t.Fatalf("router state %+v: want the endpoint at speed 2", st.Backends)
	}
}

// TestRouterExitsWhenAnAddressIsTaken: a busy admin or API address ends the
// router with an error. It used to start the API server first and then wait
// for it forever.
func TestRouterExitsWhenAnAddressIsTaken(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, args := range [][]string{
		{"--listen", "127.0.0.1:0", "--admin-listen", busy.Addr().String()},
		{"--listen", busy.Addr().String(), "--admin-listen", "127.0.0.1:0"},
	} {
		var out syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- Run(t.Context(), append(append([]string{"router"}, args...), "--backend", "http://127.0.0.1:1"),
				&Env{Stdout: &out, Stderr: &out, Getenv: os.Getenv})
		}()
		select {
		case code := <-done:
			if code != 1 || !strings.Contains(out.String(), "address already in use") {
				t.Errorf("%v: exit %d: %s", args, code, out.String())
			}
		case <-time.After(30 * time.Second): // a bound on a hang, not a timing
			t.Fatalf("%v: the router did not exit: %s", args, out.String())
		}
	}
}
