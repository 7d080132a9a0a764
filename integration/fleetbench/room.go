package fleetbench

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/nvme"
)

// fsRoom is one file system holding hosts' data directories.
type fsRoom struct {
	dir   string // the first data directory seen on it, for the message
	hosts int
	space nvme.Space
}

// checkRoom refuses a run the hosts' disks cannot hold, before any daemon
// starts: every daemon stages the whole model and leaves its reserve free,
// and hosts whose data directories share a file system (all of them, under
// one --dir) share its free space. Without the check a full disk shows as
// daemons retrying "insufficient space" until the run's timeout kills the
// wait, minutes later. Run it once the previous run's data is deleted.
func checkRoom(hosts []*netlab.Host, modelSize int64, daemonArgs []string) error {
	var order []unix.Fsid
	byFS := map[unix.Fsid]*fsRoom{}
	for _, h := range hosts {
		var st unix.Statfs_t
		if err := unix.Statfs(h.DataDir, &st); err != nil {
			return fmt.Errorf("bench fleet: free space for %s: %w", h.Name, err)
		}
		r := byFS[st.Fsid]
		if r == nil {
			r = &fsRoom{dir: h.DataDir, space: nvme.Space{Total: int64(st.Blocks) * st.Bsize, Free: int64(st.Bavail) * st.Bsize}}
			byFS[st.Fsid] = r
			order = append(order, st.Fsid)
		}
		r.hosts++
	}
	reserve := !setsReserve(daemonArgs)
	for _, id := range order {
		if err := roomFor(byFS[id], modelSize, reserve); err != nil {
			return err
		}
	}
	return nil
}

// roomFor says whether r holds its hosts' copies of the model and, if
// reserve, what the last daemon to stage leaves free by default.
func roomFor(r *fsRoom, modelSize int64, reserve bool) error {
	need := int64(r.hosts) * modelSize
	what := fmt.Sprintf("%d hosts caching %s each", r.hosts, bytesize.Format(modelSize))
	if reserve {
		res := nvme.ReserveOf(r.space, nvme.DefaultReserveBytes, nvme.DefaultReserveFraction)
		need += res
		what += fmt.Sprintf(" and the daemon's default reserve (%s)", bytesize.Format(res))
	}
	if r.space.Free >= need {
		return nil
	}
	return fmt.Errorf("bench fleet: the file system of %s has %s free; %s need %s: free some space, or keep data on a larger file system with --dir",
		r.dir, bytesize.Format(r.space.Free), what, bytesize.Format(need))
}

// setsReserve reports whether daemonArgs set the daemon's reserve
// themselves; the check then leaves the reserve to the daemon.
func setsReserve(daemonArgs []string) bool {
	for _, a := range daemonArgs {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && (name == "reserve" || name == "reserve-fraction") {
			return true
		}
	}
	return false
}
