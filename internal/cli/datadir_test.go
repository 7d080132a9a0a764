package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A DLAMI node's mount table (trimmed): the instance NVMe RAID-0 on
// /opt/dlami/nvme.
const dlamiMountInfo = `22 1 259:1 / / rw,noatime shared:1 - xfs /dev/nvme0n1p1 rw,attr2,inode64
25 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
98 22 9:0 / /opt/dlami/nvme rw,relatime shared:47 - ext4 /dev/md0 rw,stripe=128
`

func writeMountInfo(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultDataDir(t *testing.T) {
	for _, tc := range []struct{ name, mountinfo, want string }{
		{"DLAMI NVMe mounted", dlamiMountInfo, "/opt/dlami/nvme/warmfleet"},
		{"no NVMe mount", strings.Split(dlamiMountInfo, "98 ")[0], "/var/lib/warmfleet"},
		// A directory under the mount is no mount point of its own; a
		// mount point with a space is escaped and is another directory.
		{"only a sub-directory mounted", "99 22 9:0 / /opt/dlami/nvme/warmfleet rw - ext4 /dev/md0 rw\n", "/var/lib/warmfleet"},
		{"escaped neighbour", `99 22 9:0 / /opt/dlami/nvme\040old rw - ext4 /dev/md0 rw` + "\n", "/var/lib/warmfleet"},
		{"garbage", "not a mount table\n\x00\xff\n", "/var/lib/warmfleet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := defaultDataDir(writeMountInfo(t, tc.mountinfo)); got != tc.want {
				t.Errorf("defaultDataDir = %s, want %s", got, tc.want)
			}
		})
	}
	if got := defaultDataDir(filepath.Join(t.TempDir(), "missing")); got != "/var/lib/warmfleet" {
		t.Errorf("unreadable mount table: %s", got)
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/opt/dlami/nvme`:       "/opt/dlami/nvme",
		`/mnt/a\040b`:           "/mnt/a b",
		`/mnt/back\134slash`:    `/mnt/back\slash`,
		`/mnt/trailing\04`:      `/mnt/trailing\04`,
		`/mnt/not-octal\999`:    `/mnt/not-octal\999`,
		`/mnt/tab\011and\012nl`: "/mnt/tab\tand\nnl",
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDataDirFlagDefault: on a HyperPod/DLAMI node the daemon's --data-dir
// defaults under the NVMe mount, with no flag given.
func TestDataDirFlagDefault(t *testing.T) {
	old := mountInfoPath
	mountInfoPath = writeMountInfo(t, dlamiMountInfo)
	t.Cleanup(func() { mountInfoPath = old })
	fs := newFlagSet(&Env{Stderr: io.Discard}, "daemon")
	var f daemonFlags
	f.register(fs)
	if err := parseFlags(fs, &Env{Stderr: io.Discard, Getenv: noEnv}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if f.dataDir != "/opt/dlami/nvme/warmfleet" {
		t.Errorf("--data-dir defaults to %s on a DLAMI node, want /opt/dlami/nvme/warmfleet", f.dataDir)
	}
}
