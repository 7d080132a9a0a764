package vm_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/integration/vm"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// binDir holds the static binaries built once per test binary.
var binDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "warmfleet-vm-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

var (
	buildOnce           sync.Once
	warmfleetBin, agent string
	buildErr            error
)

// staticBinaries builds cmd/warmfleet and the guest agent once.
func staticBinaries(t *testing.T) (string, string) {
	t.Helper()
	buildOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		root := testenv.RepoRoot()
		if warmfleetBin, buildErr = vm.BuildStatic(ctx, root, "./cmd/warmfleet", binDir); buildErr != nil {
			return
		}
		agent, buildErr = vm.BuildStatic(ctx, root, "./integration/vm/guestagent", binDir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return warmfleetBin, agent
}

// tools finds what the suite runs, or skips (fails in CI) naming the
// Debian package that brings it.
type tools struct {
	qemu, mkfs, busybox string
	kernel              vm.Kernel
}

func findTools(t *testing.T) tools {
	t.Helper()
	var tl tools
	var err error
	if tl.qemu, err = testenv.ToolPath("qemu-system-x86_64", "Debian package qemu-system-x86"); err != nil {
		testenv.Missing(t, "%v", err)
	}
	if tl.mkfs, err = testenv.ToolPath("mkfs.ext4", "Debian package e2fsprogs"); err != nil {
		testenv.Missing(t, "%v", err)
	}
	if tl.busybox, err = testenv.ToolPath("busybox", "Debian package busybox-static"); err != nil {
		testenv.Missing(t, "%v", err)
	}
	if static, err := vm.IsStatic(tl.busybox); err != nil || !static {
		testenv.Missing(t, "%s is not a static binary (%v): install Debian package busybox-static", tl.busybox, err)
	}
	if tl.kernel, err = vm.FindKernel("/"); err != nil {
		testenv.Missing(t, "%v", err)
	}
	return tl
}

// lab is one test's power-loss set-up: a real S3 server on the host, the
// guest's initramfs pointed at it, and a freshly made ext4 image.
type lab struct {
	tools
	dir, initramfs, image, toolsImg string
	s3                              *testenv.S3
	token                           string
}

// dataDir is the daemon's --data-dir in the guest.
const dataDir = vm.DataDir + "/warmfleet"

func newLab(t *testing.T) *lab {
	t.Helper()
	l := &lab{tools: findTools(t), dir: t.TempDir()}
	l.s3 = testenv.StartS3(t)
	wf, ag := staticBinaries(t)
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		t.Fatal(err)
	}
	l.token = hex.EncodeToString(tok)
	_, port, err := net.SplitHostPort(l.s3.Addr)
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.AWSEnv("http://"+net.JoinHostPort(vm.HostFromVM, port), l.s3.AccessKey, l.s3.SecretKey, l.s3.Region)
	l.initramfs = filepath.Join(l.dir, "initramfs.cpio")
	err = vm.BuildInitramfs(l.initramfs, vm.GuestSpec{
		Kernel: l.kernel, Busybox: l.busybox,
		DaemonArgs: []string{
			"--node-name", "vm", "--data-dir", dataDir,
			"--api", fmt.Sprintf("%s:%d", vm.GuestIP, vm.APIPort), "--api-token-file", "/etc/warmfleet-token",
			"--reserve", "0", "--reserve-fraction", "0", "--containerd", "off", "--kubernetes=false",
			"--resync-interval", "0", "--part-size", "1MiB", "--log-level", "info",
		},
		DaemonEnv: env,
		Files:     map[string][]byte{"etc/warmfleet-token": []byte(l.token + "\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	l.toolsImg = filepath.Join(l.dir, "tools.img")
	if err := vm.BuildToolsImage(t.Context(), l.mkfs, l.toolsImg, wf, ag); err != nil {
		t.Fatal(err)
	}
	l.image = filepath.Join(l.dir, "base.img")
	if err := vm.MakeImage(t.Context(), l.mkfs, l.image, 256<<20); err != nil {
		t.Fatal(err)
	}
	return l
}

// machine is one boot of the guest on one disk image.
type machine struct {
	vm      *vm.VM
	disk    *vm.Disk
	nbd     net.Listener
	served  chan error
	client  *api.Client
	agent   string
	booted  time.Duration // from qemu's start to the agent's first answer
	stopped bool
}

// boot starts the guest on image; cutAt > 0 cuts the disk's power at that
// write or flush. It returns once the agent answers (the disk is mounted).
func (l *lab) boot(t *testing.T, image string, cutAt int) *machine {
	t.Helper()
	disk, err := vm.OpenDisk(image)
	if err != nil {
		t.Fatal(err)
	}
	disk.CutAt(cutAt)
	sock := filepath.Join(l.dir, "nbd.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	m := &machine{disk: disk, nbd: ln, served: make(chan error, 1)}
	go func() { m.served <- vm.ServeNBD(ln, disk) }()
	apiAddr, agentAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	start := time.Now()
	m.vm, err = vm.Start(vm.VMSpec{
		Qemu: l.qemu, Kernel: l.kernel.Image, Initramfs: l.initramfs, Tools: l.toolsImg,
		DiskSocket: sock, APIAddr: apiAddr, AgentAddr: agentAddr,
	})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { m.stop(t) })
	if m.client, err = api.NewClient(apiAddr, l.token); err != nil {
		t.Fatal(err)
	}
	m.agent = "http://" + agentAddr
	m.wait(t, "the guest agent (boot, data disk mounted)", 3*time.Minute, func(ctx context.Context) error {
		_, err := m.get(ctx, "/ready")
		return err
	})
	m.booted = time.Since(start)
	return m
}

// wait polls cond until it holds; qemu's exit ends the wait at once.
func (m *machine) wait(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stop := context.AfterFunc(t.Context(), cancel)
	defer stop()
	go func() {
		select {
		case <-m.vm.Exited():
			cancel()
		case <-ctx.Done():
		}
	}()
	err := wait.Poll(t, func() error {
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		return cond(cctx)
	}, wait.Timeout(timeout), wait.Context(ctx), wait.MaxInterval(500*time.Millisecond))
	if err != nil {
		select {
		case <-m.vm.Exited():
			err = fmt.Errorf("qemu exited (%v): %w", m.vm.ExitErr(), err)
		default:
		}
		t.Fatalf("waiting for %s: %v\nconsole:\n%s", what, err, tail(m.vm.Console(), 6000))
	}
}

func (m *machine) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.agent+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &agentError{code: resp.StatusCode, msg: strings.TrimSpace(string(b))}
	}
	return b, nil
}

type agentError struct {
	code int
	msg  string
}

func (e *agentError) Error() string { return fmt.Sprintf("agent: HTTP %d: %s", e.code, e.msg) }

// listing is the agent's answer to /hash.
type listing struct {
	Dir   string `json:"dir"`
	Files []struct {
		Path   string `json:"path"`
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	} `json:"files"`
}

// hash asks the guest for the files below dir with their SHA-256.
func (m *machine) hash(ctx context.Context, dir string) (listing, error) {
	b, err := m.get(ctx, "/hash?dir="+dir)
	if err != nil {
		return listing{}, err
	}
	var l listing
	if err := json.Unmarshal(b, &l); err != nil {
		return listing{}, fmt.Errorf("agent /hash: %w", err)
	}
	return l, nil
}

// stop kills qemu and closes the disk as is (what a later boot sees is
// decided by the caller's PowerLoss, if any, before stop).
func (m *machine) stop(t *testing.T) {
	t.Helper()
	if m.stopped {
		return
	}
	m.stopped = true
	m.vm.Kill()
	m.nbd.Close()
	if err := <-m.served; err != nil {
		t.Errorf("nbd server: %v", err)
	}
	if err := m.disk.Close(); err != nil {
		t.Errorf("disk: %v", err)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
