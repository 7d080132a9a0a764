// Package procstat reads a Linux process's resource figures from /proc:
// its peak resident set and the CPU time it has used. Benchmarks and the
// multi-host harness report these for processes they run.
package procstat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// PeakRSS returns the peak resident set, in bytes, of process pid (0: this
// process).
func PeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(path(pid, "status"))
	if err != nil {
		return 0, err
	}
	return ParseVmHWM(b)
}

// CPU returns the user plus system CPU time process pid (0: this process)
// has used.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(path(pid, "stat"))
	if err != nil {
		return 0, err
	}
	return ParseCPUTicks(b)
}

func path(pid int, name string) string {
	if pid == 0 {
		return "/proc/self/" + name
	}
	return fmt.Sprintf("/proc/%d/%s", pid, name)
}

// ParseVmHWM reads the peak resident set ("VmHWM:  1234 kB") of a
// /proc/PID/status text, in bytes.
func ParseVmHWM(status []byte) (int64, error) { //nolint:staticcheck // named after the VmHWM field
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmHWM %q: not a size in kB", rest)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 || kb > math.MaxInt64>>10 {
			return 0, fmt.Errorf("VmHWM %q: not a size in kB", rest)
		}
		return kb << 10, nil
	}
	return 0, errors.New("no VmHWM in /proc status (kernel thread or zombie?)")
}

// clockTicks is USER_HZ, which Linux fixes at 100 for what /proc shows.
const clockTicks = 100

// ParseCPUTicks sums utime and stime (fields 14 and 15 of a /proc/PID/stat
// line, counted after the command name, which may itself hold spaces and
// ")").
func ParseCPUTicks(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no command name")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil || v > math.MaxInt64/uint64(time.Second)/2 {
			return 0, fmt.Errorf("/proc stat: CPU ticks %q", s)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
