package vm

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// TestFsckRepairsTheDataDisk: the boot-time check bootMachine runs when
// the data disk does not mount fixes what e2fsck can fix (here a
// superblock whose checksum no longer matches), after which the image is
// clean; an image that is no file system at all is an error, not a repair.
func TestFsckRepairsTheDataDisk(t *testing.T) {
	mkfs, err := testenv.ToolPath("mkfs.ext4", "Debian package e2fsprogs")
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	fsck, err := testenv.ToolPath("e2fsck", "Debian package e2fsprogs")
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	img := t.TempDir() + "/data.img"
	if err := MakeImage(t.Context(), mkfs, img, 16<<20); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// s_free_blocks_count, 12 bytes into the superblock at 1024.
	if _, err := f.WriteAt([]byte{0, 0, 0, 0}, 1024+12); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	r := &run{opts: PowerCutOptions{Tools: Tools{Fsck: fsck}}, image: img}
	out, err := r.fsck(t.Context())
	if err != nil || !strings.Contains(out, "FILE SYSTEM WAS MODIFIED") {
		t.Fatalf("fsck of a damaged image: %v, report %q", err, out)
	}
	if err := exec.Command(fsck, "-fn", img).Run(); err != nil {
		t.Fatalf("after the repair, e2fsck -fn finds the image unclean: %v", err)
	}

	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.fsck(t.Context()); err == nil || !strings.Contains(err.Error(), "e2fsck -fy") {
		t.Fatalf("fsck of zeros: %v, want e2fsck's failure", err)
	}
	if got := oneLine("a\n b \n\nc"); got != "a | b | | c" {
		t.Errorf("oneLine = %q", got)
	}
}
