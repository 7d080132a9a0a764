package cli

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

const (
	// fallbackDataDir is the data directory on a node without a known
	// NVMe mount (and the systemd unit's StateDirectory).
	fallbackDataDir = "/var/lib/warmfleet"
	// dlamiNVMe is where the AWS Deep Learning AMI, and so SageMaker
	// HyperPod's nodes, mount the instance's NVMe drives (RAID-0 when
	// there are several).
	dlamiNVMe = "/opt/dlami/nvme"
	// maxMountInfo bounds how much of the mount table is read: a host
	// with thousands of mounts has a few hundred KiB.
	maxMountInfo = 16 << 20
)

// mountInfoPath is this process's mount table; tests point it elsewhere.
var mountInfoPath = "/proc/self/mountinfo"

// defaultDataDir is --data-dir's default: under the DLAMI's NVMe mount
// when there is one, so a HyperPod node caches on its NVMe with no flag,
// else fallbackDataDir. A mount table that cannot be read counts as no
// NVMe mount.
func defaultDataDir(mountinfo string) string {
	f, err := os.Open(mountinfo)
	if err != nil {
		return fallbackDataDir
	}
	defer f.Close()
	if isMountPoint(io.LimitReader(f, maxMountInfo), dlamiNVMe) {
		return filepath.Join(dlamiNVMe, "warmfleet")
	}
	return fallbackDataDir
}

// isMountPoint reports whether dir is a mount point in a mountinfo table
// (proc(5): the fifth field is the mount point, with space, tab, newline
// and backslash written as octal escapes).
func isMountPoint(mountinfo io.Reader, dir string) bool {
	sc := bufio.NewScanner(mountinfo)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && unescapeMount(fields[4]) == dir {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
