// Package procstat reads a Linux process's resource figures from /proc:
// its peak resident set and the CPU time it has used. Benchmarks and the
// multi-host harness report these for processes they run. The parsing is
// prometheus/procfs's (the library the Prometheus process collector uses);
// this package only picks the two figures and checks they make sense.
package procstat

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/procfs"
)

// PeakRSS returns the peak resident set, in bytes, of process pid (0: this
// process).
func PeakRSS(pid int) (int64, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, fmt.Errorf("peak rss: %w", err)
	}
	return peakRSS(fs, pid)
}

// CPU returns the user plus system CPU time process pid (0: this process)
// has used.
func CPU(pid int) (time.Duration, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, fmt.Errorf("cpu time: %w", err)
	}
	return cpu(fs, pid)
}

func proc(fs procfs.FS, pid int) (procfs.Proc, error) {
	if pid == 0 {
		return fs.Self()
	}
	return fs.Proc(pid)
}

func peakRSS(fs procfs.FS, pid int) (int64, error) {
	p, err := proc(fs, pid)
	if err != nil {
		return 0, fmt.Errorf("peak rss: %w", err)
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, fmt.Errorf("peak rss: %w", err)
	}
	switch {
	case st.VmHWM == 0:
		// procfs leaves a field the kernel did not write at zero.
		return 0, errors.New("peak rss: no VmHWM in /proc status (kernel thread or zombie?)")
	case st.VmHWM > math.MaxInt64:
		return 0, fmt.Errorf("peak rss: VmHWM %d out of range", st.VmHWM)
	}
	return int64(st.VmHWM), nil
}

func cpu(fs procfs.FS, pid int) (time.Duration, error) {
	p, err := proc(fs, pid)
	if err != nil {
		return 0, fmt.Errorf("cpu time: %w", err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("cpu time: %w", err)
	}
	const limit = math.MaxInt64 / uint64(time.Second) / 2
	if uint64(st.UTime) > limit || uint64(st.STime) > limit {
		return 0, fmt.Errorf("cpu time: ticks %d+%d out of range", st.UTime, st.STime)
	}
	return time.Duration(st.CPUTime() * float64(time.Second)), nil
}
