package integration

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// TestCorruptingPeer serves a known stream on h1 through a proxy on h1 and
// checks that h0 gets it intact, then corrupted where the Mangle says, then
// reset.
func TestCorruptingPeer(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 2, Link: 200 * netlab.Mbit})
	ctx := t.Context()
	h0, h1 := lab.Hosts()[0], lab.Hosts()[1]
	payload := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB

	ln, err := h1.NS.Listen("tcp", h1.Addr(7000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Write(payload)
			}()
		}
	}()
	proxy, err := h1.Proxy(h1.Addr(7001), h1.Addr(7000))
	if err != nil {
		t.Fatal(err)
	}
	fetch := func() ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, err := h0.NS.DialContext(ctx, "tcp", h1.Addr(7001))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return io.ReadAll(c)
	}

	got, err := fetch()
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("clean fetch: %d bytes, equal=%v, err=%v", len(got), bytes.Equal(got, payload), err)
	}

	const every = 1000
	proxy.SetMangle(netlab.FlipEvery(every))
	got, err = fetch()
	if err != nil || len(got) != len(payload) {
		t.Fatalf("corrupt fetch: %d bytes, err=%v", len(got), err)
	}
	diffs := 0
	for i := range got {
		if got[i] != payload[i] {
			diffs++
			if (i+1)%every != 0 {
				t.Fatalf("byte %d corrupted, want only every %dth", i, every)
			}
		}
	}
	if want := len(payload) / every; diffs != want {
		t.Errorf("%d bytes corrupted, want %d", diffs, want)
	}

	proxy.SetMangle(nil)
	proxy.Refuse(true)
	if _, err := fetch(); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("fetch from a refusing proxy: err = %v, want ECONNRESET", err)
	}
	proxy.Refuse(false)
	if got, err := fetch(); err != nil || !bytes.Equal(got, payload) {
		t.Errorf("fetch after refusal ended: %d bytes, err=%v", len(got), err)
	}
}

// TestDiskFill gives h0 a 4 MiB disk, fills it, and checks that writes fail
// with ENOSPC until it is freed, and that processes in h0 see that disk.
func TestDiskFill(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 1})
	h0 := lab.Hosts()[0]
	if err := h0.FillDisk(0); err == nil {
		t.Fatal("FillDisk on the machine's own disk succeeded, want a refusal")
	}
	if err := h0.LimitDisk(4 << 20); err != nil {
		t.Fatal(err)
	}
	out, err := h0.Command(t.Context(), "stat", "-f", "-c", "%T %b %S", h0.DataDir).CombinedOutput()
	if err != nil {
		t.Fatalf("stat in h0: %v: %s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) != 3 || f[0] != "tmpfs" {
		t.Fatalf("h0 sees its data dir as %q, want a tmpfs", out)
	}
	blocks, _ := strconv.ParseInt(f[1], 10, 64)
	bsize, _ := strconv.ParseInt(f[2], 10, 64)
	if blocks*bsize != 4<<20 {
		t.Errorf("h0's data dir holds %d bytes, want %d", blocks*bsize, 4<<20)
	}

	probe := filepath.Join(h0.DataDir, "probe")
	if err := os.WriteFile(probe, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatalf("write 1 MiB to an empty 4 MiB disk: %v", err)
	}
	if err := h0.FillDisk(64 << 10); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(probe+"2", make([]byte, 1<<20), 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("write 1 MiB to a full disk: err = %v, want ENOSPC", err)
	}
	if err := h0.FreeDisk(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(probe+"2", make([]byte, 1<<20), 0o644); err != nil {
		t.Errorf("write after FreeDisk: %v", err)
	}
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	if out, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(out), h0.DataDir) {
		t.Errorf("tmpfs at %s still mounted after Close", h0.DataDir)
	}
}

// TestProcessLifecycle starts a process in h0 and checks its namespace, its
// log, its figures, and kill and restart.
func TestProcessLifecycle(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 1})
	h0 := lab.Hosts()[0]
	p, err := h0.Start(netlab.ProcSpec{
		Name: "sleeper",
		Path: "/bin/sh",
		Args: []string{"-c", `echo "started with $NETLAB_TEST_VAR"; exec sleep 60`},
		Env:  []string{"NETLAB_TEST_VAR=hello"},
	})
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the process logs its start", func() bool { return strings.Contains(p.Log(), "started with hello") })

	nsOf := func(path string) string {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		return strconv.FormatUint(st.Ino, 10)
	}
	firstPID := p.PID()
	if got, want := nsOf("/proc/"+strconv.Itoa(firstPID)+"/ns/net"), nsOf("/run/netns/"+h0.NS.Name()); got != want {
		t.Errorf("process runs in netns inode %s, want h0's %s", got, want)
	}
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if !st.Running || st.PeakRSS <= 0 {
		t.Errorf("stats of a running process = %+v, want running with a peak RSS", st)
	}

	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if p.Running() {
		t.Fatal("process runs after Kill")
	}
	if err := p.Wait(); err == nil {
		t.Errorf("Wait after SIGKILL = nil, want an exit error")
	}
	st, err = p.Stats()
	if err != nil || st.Running || st.PeakRSS <= 0 {
		t.Errorf("stats after exit = %+v, %v; want not running, with the peak RSS from rusage", st, err)
	}

	if err := p.Restart(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if p.PID() == firstPID || !p.Running() {
		t.Errorf("after Restart: pid %d (was %d), running %v", p.PID(), firstPID, p.Running())
	}
	wait.For(t, "the restarted process logs its start", func() bool { return strings.Count(p.Log(), "started with hello") == 2 })
	if err := p.Stop(5 * time.Second); err != nil {
		t.Errorf("Stop: %v", err)
	}
}
