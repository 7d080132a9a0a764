package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// crashedLab describes what the "crashlab" helper built before it was killed.
type crashedLab struct {
	RunID      string   `json:"run_id"`
	Subnet     string   `json:"subnet"`
	Namespaces []string `json:"namespaces"`
	Mount      string   `json:"mount"`
}

// TestSweepAfterCrash builds a lab in a child process, kills the child with
// SIGKILL (so none of its cleanup runs) and checks that Sweep removes its
// namespaces, mount and blackhole route.
func TestSweepAfterCrash(t *testing.T) {
	cmd, crashed := startCrashLab(t)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for _, n := range crashed.Namespaces {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); err != nil {
			t.Fatalf("namespace %s of the killed run is missing before the sweep: %v", n, err)
		}
	}
	if err := netlab.Sweep(t.Context(), "wf", slog.New(slog.NewTextHandler(tbLog{t}, nil))); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	assertGone(t, crashed)
}

// TestInterruptCleansUp sends SIGINT to a process with a lab and checks
// that the lab is gone when the process has exited, with no sweep.
func TestInterruptCleansUp(t *testing.T) {
	cmd, crashed := startCrashLab(t)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Errorf("helper exited 0 after SIGINT, want death by the signal")
	}
	assertGone(t, crashed)
}

// startCrashLab runs the "crashlab" helper and returns it with what it built.
func startCrashLab(t *testing.T) (*exec.Cmd, crashedLab) {
	t.Helper()
	testenv.RequireRoot(t)
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), netlabtest.HelperEnv+"=crashlab", "NETLAB_DIR="+t.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var crashed crashedLab
	if err := json.NewDecoder(bufio.NewReader(stdout)).Decode(&crashed); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("crashlab helper: %v; stderr:\n%s", err, stderr.String())
	}
	return cmd, crashed
}

func assertGone(t *testing.T, crashed crashedLab) {
	t.Helper()
	for _, n := range crashed.Namespaces {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s left behind", n)
		}
	}
	if out := mustRun(t, "ip", "route", "show", "exact", crashed.Subnet, "table", "main"); out != "" {
		t.Errorf("route %q left behind", out)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), crashed.Mount) {
		t.Errorf("mount %s left behind", crashed.Mount)
	}
	if _, err := os.Stat(filepath.Join("/run/warmfleet-netlab", crashed.RunID+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file of %s left behind", crashed.RunID)
	}
}

type tbLog struct{ t *testing.T }

func (w tbLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// helperCrashLab builds a lab with a process and a small disk, prints what
// it built and waits to be killed.
func helperCrashLab(ctx context.Context) error {
	lab, err := netlab.New(ctx, netlab.Options{Hosts: 2, Link: 50 * netlab.Mbit, Dir: os.Getenv("NETLAB_DIR")})
	if err != nil {
		return err
	}
	h0 := lab.Hosts()[0]
	if err := h0.LimitDisk(1 << 20); err != nil {
		return err
	}
	if _, err := h0.Start(netlab.ProcSpec{Name: "sleeper", Path: "/bin/sleep", Args: []string{"600"}}); err != nil {
		return err
	}
	b, err := json.Marshal(crashedLab{RunID: lab.RunID(), Subnet: lab.Subnet().String(), Namespaces: lab.Namespaces(), Mount: h0.DataDir})
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	time.Sleep(time.Minute)
	return errors.New("crashlab helper was not killed")
}
