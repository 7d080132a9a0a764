package gossip

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

const keyFileHelperEnv = "WARMFLEET_TEST_LOAD_KEY_FILE"

// TestKeyFileThroughFSGroup runs LoadKeyFile in a process with a non-root
// user and group, as a Kubernetes container with runAsUser/runAsGroup/
// fsGroup 65532 runs: the kubelet hands it the Secret's file as mode 0440,
// group 65532. It loads; the same file in another group does not.
func TestKeyFileThroughFSGroup(t *testing.T) {
	if path := os.Getenv(keyFileHelperEnv); path != "" {
		if _, err := LoadKeyFile(path); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.RequireRoot(t)
	// A directory and a copy of this test binary that the other user can
	// reach (the test's own temp dirs are private to root).
	dir, err := os.MkdirTemp("", "keyfile-fsgroup-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "gossip.test")
	copyFile(t, os.Args[0], bin, 0o755)
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "cluster.key")
	if err := os.WriteFile(key, []byte(EncodeKey(k)+"\n"), 0o440); err != nil {
		t.Fatal(err)
	}
	load := func(gid int) error {
		if err := os.Chown(key, 0, gid); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-test.run=^TestKeyFileThroughFSGroup$")
		cmd.Env = append(os.Environ(), keyFileHelperEnv+"="+key)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	if err := load(65532); err != nil {
		t.Errorf("key file 0440 in the process's group 65532: %v", err)
	}
	if err := load(65533); err == nil {
		t.Error("key file 0440 in another group loaded")
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
