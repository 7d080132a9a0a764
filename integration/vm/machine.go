package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/integration/vm/agent"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// machine is one boot of the guest on one disk image: qemu, the NBD
// server of its data disk, and clients of the daemon's API and the agent.
type machine struct {
	vm      *VM
	disk    *Disk
	nbd     net.Listener
	served  chan error
	client  *api.Client
	agent   string
	booted  time.Duration // from qemu's start to the agent's first answer
	stopped bool
}

// boot restores the guest from the saved state and plugs in image as its
// data disk; cutAt > 0 cuts the disk's power at that write or flush. It
// returns once the agent answers (the disk is mounted). The caller stops
// the machine (stop), also after an error.
func (r *run) boot(ctx context.Context, cutAt int) (*machine, error) {
	disk, err := OpenDisk(r.image)
	if err != nil {
		return nil, err
	}
	disk.CutAt(cutAt)
	sock := filepath.Join(r.dir, "nbd.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("power cuts: %w", err), disk.Close())
	}
	m := &machine{disk: disk, nbd: ln, served: make(chan error, 1)}
	go func() { m.served <- ServeNBD(ln, disk) }()
	start := time.Now()
	apiAddr, agentAddr, err := r.start(m, r.state)
	if err != nil {
		return nil, errors.Join(err, m.close())
	}
	if m.client, err = api.NewClient(apiAddr, r.token); err != nil {
		return m, err
	}
	m.agent = "http://" + agentAddr
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	err = m.vm.AttachDisk(actx, sock)
	cancel()
	if err != nil {
		err = fmt.Errorf("%w\nconsole:\n%s", err, tail(m.vm.Console(), 4000))
	} else {
		err = m.wait(ctx, "the guest agent (data disk mounted)", 3*time.Minute, func(ctx context.Context) error {
			_, err := m.get(ctx, "/ready")
			return err
		})
	}
	m.booted = time.Since(start)
	return m, err
}

// start starts qemu for m, restoring the state saved at restore ("": a
// boot of the kernel), and returns the host addresses of the daemon's API
// and of the agent.
func (r *run) start(m *machine, restore string) (apiAddr, agentAddr string, err error) {
	if apiAddr, err = testenv.PickFreeAddr(); err != nil {
		return "", "", err
	}
	if agentAddr, err = testenv.PickFreeAddr(); err != nil {
		return "", "", err
	}
	qmp := filepath.Join(r.dir, "qmp.sock")
	_ = os.Remove(qmp)
	m.vm, err = Start(VMSpec{
		Qemu: r.opts.Tools.Qemu, Kernel: r.opts.Tools.Kernel.Image, Initramfs: r.initramfs, Tools: r.toolsImg,
		QMP: qmp, Restore: restore, APIAddr: apiAddr, AgentAddr: agentAddr,
	})
	return apiAddr, agentAddr, err
}

// saveState boots the kernel once, up to where the guest's init waits for
// the data disk, and saves that state for every boot to restore: a cut's
// reboot then costs the state's load instead of the firmware, the
// kernel's start, the modules and init, all emulated.
func (r *run) saveState(ctx context.Context) error {
	m := &machine{}
	if _, _, err := r.start(m, ""); err != nil {
		return fmt.Errorf("power cuts: %w", err)
	}
	defer m.vm.Kill()
	err := m.wait(ctx, "the guest's init (waiting for the data disk)", 3*time.Minute, func(context.Context) error {
		if !m.vm.ConsoleHas(markerWaiting) {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("power cuts: first boot: %w", err)
	}
	state := filepath.Join(r.dir, "booted.state")
	if err := m.vm.Save(ctx, state); err != nil {
		return fmt.Errorf("power cuts: %w\nconsole:\n%s", err, tail(m.vm.Console(), 4000))
	}
	r.state = state
	return nil
}

// wait polls cond until it holds; qemu's exit ends the wait at once. The
// error names what it waited for and ends with the guest's console.
func (m *machine) wait(ctx context.Context, what string, timeout time.Duration, cond func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.vm.Exited():
			cancel()
		case <-ctx.Done():
		}
	}()
	err := wait.Until(ctx, func() error {
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		return cond(cctx)
	}, wait.Timeout(timeout))
	if err == nil {
		return nil
	}
	select {
	case <-m.vm.Exited():
		err = fmt.Errorf("qemu exited (%v): %w", m.vm.ExitErr(), err)
	default:
	}
	return fmt.Errorf("waiting for %s: %w\nconsole:\n%s", what, err, tail(m.vm.Console(), 6000))
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

// hash asks the guest for the files below dir with their SHA-256.
func (m *machine) hash(ctx context.Context, dir string) (agent.Listing, error) {
	b, err := m.get(ctx, "/hash?dir="+dir)
	if err != nil {
		return agent.Listing{}, err
	}
	var l agent.Listing
	if err := json.Unmarshal(b, &l); err != nil {
		return agent.Listing{}, fmt.Errorf("agent /hash: %w", err)
	}
	return l, nil
}

// stop kills qemu and closes the disk as is (what a later boot sees is
// decided by the caller's PowerLoss, if any, before stop).
func (m *machine) stop() error {
	if m.stopped {
		return nil
	}
	m.stopped = true
	if m.vm != nil {
		m.vm.Kill()
	}
	return m.close()
}

func (m *machine) close() error {
	m.nbd.Close()
	var errs []error
	if err := <-m.served; err != nil {
		errs = append(errs, fmt.Errorf("nbd server: %w", err))
	}
	if err := m.disk.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// waitAPI waits until the daemon answers.
func (m *machine) waitAPI(ctx context.Context) error {
	return m.wait(ctx, "the daemon's API", 2*time.Minute, func(ctx context.Context) error {
		_, err := m.client.Caches(ctx)
		return err
	})
}

func (m *machine) add(ctx context.Context, mod sourceModel) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := m.client.AddCache(ctx, api.AddCacheRequest{Name: mod.name, Source: mod.source}); err != nil {
		return fmt.Errorf("add %s: %w\nconsole:\n%s", mod.name, err, tail(m.vm.Console(), 4000))
	}
	return nil
}

// waitItem waits until the daemon reports w's item ready.
func (m *machine) waitItem(ctx context.Context, w workload, name string) error {
	return m.wait(ctx, name+" ready", 3*time.Minute, func(ctx context.Context) error {
		ok, state, err := w.ready(ctx, m, name)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s: %s", name, state)
		}
		return nil
	})
}

// waitCutOrReady waits until the armed cut happens (true) or w's item is
// ready first (false: the cut is disarmed).
func (m *machine) waitCutOrReady(ctx context.Context, w workload, name string) (bool, error) {
	cut := false
	err := m.wait(ctx, "the power cut or "+name+" ready", 3*time.Minute, func(ctx context.Context) error {
		select {
		case <-m.disk.Cut():
			cut = true
			return nil
		default:
		}
		// Short: a guest whose disk just lost its power may not answer.
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		ok, state, err := w.ready(sctx, m, name)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s: %s", name, state)
		}
		m.disk.CutAt(0)
		select {
		case <-m.disk.Cut():
			cut = true
		default:
		}
		return nil
	})
	return cut, err
}

// audit reads every model's status right after a reboot, in one call: a
// model whose add was acknowledged must still be known, and every model
// reported ready must hold its source's files exactly. It returns the
// models that were ready before the power went off (the daemon may have
// resumed and published others since it started), and the violations:
// models lost and models corrupt.
func (m *machine) audit(ctx context.Context, models []sourceModel, poweredOff time.Time) (readyBefore, lost, corrupt []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	all, err := m.client.Caches(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("caches after the reboot: %w", err)
	}
	status := map[string]api.CacheStatus{}
	for _, st := range all {
		status[st.Name] = st
	}
	for _, mod := range models {
		st, ok := status[mod.name]
		if !ok {
			lost = append(lost, mod.name+" was added (acknowledged) before the cut and is unknown after it")
			continue
		}
		if !st.Ready {
			// Not ready, but a serving framework follows the current link
			// whatever the daemon says: if it is there, it must lead to
			// whole files.
			v, err := m.checkCurrent(ctx, mod)
			if err != nil {
				return nil, nil, nil, err
			}
			if v != "" {
				corrupt = append(corrupt, fmt.Sprintf("%s not ready after the reboot, but its current link leads to %s", mod.name, v))
			}
			continue
		}
		// The guest's clock comes from the host's at boot (whole seconds).
		if st.ReadyAt.Before(poweredOff.Add(time.Second)) {
			readyBefore = append(readyBefore, mod.name)
		}
		v, err := m.check(ctx, mod)
		if err != nil {
			return nil, nil, nil, err
		}
		if v != "" {
			corrupt = append(corrupt, "reported ready after the reboot: "+v)
		}
	}
	return readyBefore, lost, corrupt, nil
}

// check compares a ready model, as the daemon reports it and through its
// current link, with the source: every file there with its size and
// SHA-256, nothing else. It returns what is wrong, or "".
func (m *machine) check(ctx context.Context, mod sourceModel) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	st, err := m.client.Cache(ctx, mod.name)
	if err != nil {
		return "", fmt.Errorf("status of %s: %w", mod.name, err)
	}
	if !st.Ready {
		return fmt.Sprintf("%s is not ready (%s)", mod.name, st.State), nil
	}
	var problems []string
	// Through the current link first; the reported path is hashed again
	// only when the link leads elsewhere.
	for _, dir := range []string{currentLink(mod), st.Path} {
		l, err := m.hash(ctx, dir)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", dir, err))
			continue
		}
		if p := compare(l, mod); p != "" {
			problems = append(problems, dir+": "+p)
		}
		if l.Dir == st.Path {
			break
		}
	}
	if len(problems) == 0 {
		return "", nil
	}
	return mod.name + " ready with " + strings.Join(problems, "; "), nil
}

// checkCurrent compares what the model's current link leads to, if it is
// there, with the source; "" when it matches or is not there.
func (m *machine) checkCurrent(ctx context.Context, mod sourceModel) (string, error) {
	l, err := m.hash(ctx, currentLink(mod))
	var ae *agentError
	if errors.As(err, &ae) && ae.code == http.StatusNotFound {
		return "", nil
	}
	if err != nil {
		return err.Error(), nil
	}
	return compare(l, mod), nil
}

func currentLink(mod sourceModel) string { return guestDataDir + "/models/" + mod.name + "/current" }

// compare lists how a guest directory differs from the model's source.
func compare(l agent.Listing, mod sourceModel) string {
	var bad []string
	seen := map[string]bool{}
	for _, f := range l.Files {
		seen[f.Path] = true
		want, ok := mod.files[f.Path]
		switch {
		case !ok:
			bad = append(bad, f.Path+" is not in the source")
		case f.Size != mod.sizes[f.Path]:
			bad = append(bad, fmt.Sprintf("%s has %d bytes, want %d", f.Path, f.Size, mod.sizes[f.Path]))
		case f.SHA256 != want:
			bad = append(bad, fmt.Sprintf("%s has SHA-256 %.12s, want %.12s", f.Path, f.SHA256, want))
		}
	}
	for path := range mod.files {
		if !seen[path] {
			bad = append(bad, path+" is missing")
		}
	}
	slices.Sort(bad)
	return strings.Join(bad, ", ")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
