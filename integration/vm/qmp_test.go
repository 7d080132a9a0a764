package vm

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// TestQMPAgainstQemu talks to a real qemu (an empty machine, not started):
// the greeting and capability negotiation, a command's return value, and
// a command qemu refuses, which is an error naming it and qemu's reason.
func TestQMPAgainstQemu(t *testing.T) {
	qemu, err := testenv.ToolPath("qemu-system-x86_64", "Debian package qemu-system-x86")
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	cmd := exec.Command(qemu, "-machine", "none", "-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-qmp", "unix:"+sock+",server=on,wait=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	q, err := dialQMP(ctx, sock, exited)
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	var st struct{ Status string }
	if err := q.run(ctx, "query-status", nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Status != "prelaunch" {
		t.Errorf("status %q, want prelaunch (qemu -S)", st.Status)
	}
	polls := 0
	err = q.poll(ctx, "query-status", &st, func() (bool, error) { polls++; return polls == 3, nil })
	if err != nil || polls != 3 {
		t.Errorf("poll: %v after %d polls, want done after 3", err, polls)
	}
	err = q.run(ctx, "device_add", map[string]any{"driver": "no-such-device"}, nil)
	if err == nil || !strings.Contains(err.Error(), "device_add") || !strings.Contains(err.Error(), "no-such-device") {
		t.Errorf("refused command: err %v, want one naming the command and qemu's reason", err)
	}
	// The connection still works after an error.
	if err := q.run(ctx, "query-status", nil, &st); err != nil {
		t.Errorf("after an error: %v", err)
	}
}

// TestDialQMPQemuGone: a qemu that exits before its socket accepts ends
// the dial at once, with an error.
func TestDialQMPQemuGone(t *testing.T) {
	exited := make(chan struct{})
	close(exited)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := dialQMP(ctx, filepath.Join(t.TempDir(), "absent.sock"), exited); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("err %v, want qemu exited", err)
	}
}
