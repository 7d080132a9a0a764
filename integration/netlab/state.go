package netlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// stateDir holds one file per live run listing what it created, so a later
// run can undo a crashed one. It lives on /run: a reboot clears it together
// with the namespaces and routes it describes.
const stateDir = "/run/warmfleet-netlab"

// runState is what a run owns. It is written before anything is created,
// so a crash at any point leaves a record of everything that may exist.
type runState struct {
	RunID      string       `json:"run_id"`
	PID        int          `json:"pid"`
	StartTicks uint64       `json:"start_ticks"` // /proc/PID/stat starttime: tells a reused PID apart
	Subnet     netip.Prefix `json:"subnet"`
	Route      bool         `json:"route"` // the blackhole route for Subnet is ours
	Namespaces []string     `json:"namespaces"`
	Mounts     []string     `json:"mounts"`
	RunDir     string       `json:"run_dir"`
}

func statePath(runID string) string { return filepath.Join(stateDir, runID+".json") }

func (s *runState) save() error {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := statePath(s.RunID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write run state: %w", err)
	}
	if err := os.Rename(tmp, statePath(s.RunID)); err != nil {
		return fmt.Errorf("write run state: %w", err)
	}
	return nil
}

// procStartTicks reads the start time of a process, in clock ticks since
// boot, or reports that the process does not exist.
func procStartTicks(pid int) (uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	return parseStartTicks(string(b))
}

// parseStartTicks takes field 22 of /proc/PID/stat. The command name (field
// 2) may hold spaces and parentheses, so fields are counted after its last ')'.
func parseStartTicks(stat string) (uint64, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return v, err == nil
}

// alive reports whether the process that wrote s still runs.
func (s *runState) alive() bool {
	ticks, ok := procStartTicks(s.PID)
	return ok && ticks == s.StartTicks
}

// ownerOf extracts the PID from a name "<prefix>-<pid>-<rest>".
func ownerOf(prefix, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok {
		return 0, false
	}
	pidStr, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(pidStr)
	return pid, err == nil && pid > 0
}

// Sweep removes what crashed runs with this prefix left behind: the
// namespaces (and processes in them), mounts, blackhole routes and run
// directories of every run whose process is gone. Live runs, including
// concurrent ones in other processes, are left alone.
func Sweep(ctx context.Context, prefix string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Routes are listed before the state files are read: a live run writes
	// its state before it adds its route, so every live route is claimed.
	routesOut, err := ip(ctx, "-4", "-j", "route", "show", "table", "all", "proto", routeProto)
	if err != nil {
		return err
	}
	_, routes, err := parseRoutes([]byte(routesOut))
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(stateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sweep: %w", err)
	}
	var errs []error
	liveSubnets := map[netip.Prefix]bool{}
	liveRuns := map[string]bool{}
	var dead []*runState
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") || !strings.HasPrefix(e.Name(), prefix+"-") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(stateDir, e.Name()))
		if err != nil {
			continue // removed by its owner meanwhile
		}
		var st runState
		if err := json.Unmarshal(b, &st); err != nil {
			errs = append(errs, fmt.Errorf("sweep: bad state file %s: %w", e.Name(), err))
			continue
		}
		if st.alive() {
			liveSubnets[st.Subnet] = true
			liveRuns[st.RunID] = true
			continue
		}
		dead = append(dead, &st)
	}
	swept := map[netip.Prefix]bool{}
	for _, st := range dead {
		swept[st.Subnet] = true
		log.Info("netlab: sweeping leftovers of a dead run", "run", st.RunID, "pid", st.PID)
		// A run that died while trying a subnet another run had taken
		// recorded that subnet too: the route is the live run's.
		st.Route = st.Route && !liveSubnets[st.Subnet]
		errs = append(errs, teardown(ctx, st, log))
	}
	// Namespaces whose state file never got written or was lost.
	names, err := namespaceNames()
	errs = append(errs, err)
	for _, n := range names {
		pid, ok := ownerOf(prefix, n)
		if !ok || liveRuns[runIDOf(n)] {
			continue
		}
		if _, running := procStartTicks(pid); running || pid == os.Getpid() {
			continue // its owner may still be setting up: not ours to judge
		}
		log.Info("netlab: sweeping orphan namespace", "netns", n)
		errs = append(errs, deleteNetns(ctx, n))
	}
	for _, r := range routes {
		p, err := parsePrefix(r.Dst)
		if err != nil || r.Type != "blackhole" || liveSubnets[p] || swept[p] {
			continue
		}
		log.Info("netlab: sweeping orphan blackhole route", "subnet", p)
		errs = append(errs, deleteRoute(ctx, p))
	}
	return errors.Join(errs...)
}

// runIDOf returns "<prefix>-<pid>-<rand>" of a namespace name
// "<prefix>-<pid>-<rand>-<host>".
func runIDOf(ns string) string {
	i := strings.LastIndexByte(ns, '-')
	if i < 0 {
		return ns
	}
	return ns[:i]
}

// teardown undoes everything st lists, in the order that frees each part:
// processes, mounts, namespaces (which take their veths along), the route,
// the run directory and finally the state file. It goes on after errors.
func teardown(ctx context.Context, st *runState, log *slog.Logger) error {
	var errs []error
	for _, n := range st.Namespaces {
		killNetnsProcs(ctx, n, log)
	}
	for _, m := range st.Mounts {
		errs = append(errs, unmount(m))
	}
	for _, n := range st.Namespaces {
		errs = append(errs, deleteNetns(ctx, n))
	}
	if st.Route {
		errs = append(errs, deleteRoute(ctx, st.Subnet))
	}
	if st.RunDir != "" {
		errs = append(errs, os.RemoveAll(st.RunDir))
	}
	if err := os.Remove(statePath(st.RunID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killNetnsProcs kills every process left in a namespace so deleting it
// really frees it.
func killNetnsProcs(ctx context.Context, ns string, log *slog.Logger) {
	out, err := ip(ctx, "netns", "pids", ns)
	if err != nil {
		return
	}
	for _, f := range strings.Fields(out) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			log.Info("netlab: killing process left in namespace", "netns", ns, "pid", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func deleteNetns(ctx context.Context, ns string) error {
	if _, err := os.Stat(filepath.Join(netnsDir, ns)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	_, err := ip(ctx, "netns", "del", ns)
	return err
}

// unmount detaches a mount the run made, lazily if something still holds it.
func unmount(path string) error {
	mounted, err := isMountPoint(path)
	if err != nil || !mounted {
		return err
	}
	if err := syscall.Unmount(path, 0); err != nil {
		if err := syscall.Unmount(path, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	return nil
}

// isMountPoint reports whether path is a mount point in this mount namespace.
func isMountPoint(path string) (bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	return mountInfoHas(string(b), path), nil
}

// mountInfoHas looks for path as a mount point (field 5) in mountinfo text.
// Paths there escape space, tab, newline and backslash as octal.
func mountInfoHas(mountinfo, path string) bool {
	esc := strings.NewReplacer(" ", `\040`, "\t", `\011`, "\n", `\012`, `\`, `\134`).Replace(filepath.Clean(path))
	for line := range strings.SplitSeq(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == esc {
			return true
		}
	}
	return false
}

// deleteRoute removes the harness's blackhole route for p; one already gone
// is fine.
func deleteRoute(ctx context.Context, p netip.Prefix) error {
	_, err := ip(ctx, "route", "del", "blackhole", p.String(), "proto", routeProto)
	if err != nil && strings.Contains(err.Error(), "No such process") {
		return nil
	}
	return err
}
