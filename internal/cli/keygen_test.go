package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/gossip"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	e := &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	code = Run(context.Background(), args, e)
	return code, out.String(), errb.String()
}

func TestKeygen(t *testing.T) {
	code, out, stderr := runCLI("keygen")
	if code != 0 {
		t.Fatalf("keygen: exit %d: %s", code, stderr)
	}
	if _, err := gossip.ParseKey(out); err != nil {
		t.Fatalf("keygen printed %q: %v", out, err)
	}
	_, out2, _ := runCLI("keygen")
	if out == out2 {
		t.Fatal("two keys are equal")
	}

	path := filepath.Join(t.TempDir(), "cluster.key")
	if code, _, stderr := runCLI("keygen", "--out", path); code != 0 {
		t.Fatalf("keygen --out: exit %d: %s", code, stderr)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", st.Mode().Perm())
	}
	first, err := gossip.LoadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}

	code, _, stderr = runCLI("keygen", "--out", path)
	if code == 0 || !strings.Contains(stderr, "--force") {
		t.Fatalf("overwrite without --force: exit %d: %s", code, stderr)
	}
	if again, _ := gossip.LoadKeyFile(path); !bytes.Equal(again[0], first[0]) {
		t.Fatal("the refused overwrite changed the key")
	}
	if code, _, stderr := runCLI("keygen", "--out", path, "--force"); code != 0 {
		t.Fatalf("keygen --force: exit %d: %s", code, stderr)
	}
	second, err := gossip.LoadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(second[0], first[0]) {
		t.Fatal("--force kept the old key")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("replaced key file mode %v", st.Mode().Perm())
	}
	if code, _, _ := runCLI("keygen", "extra"); code != 2 {
		t.Fatalf("extra argument: exit %d, want 2", code)
	}
	blocked := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocked, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI("keygen", "--out", filepath.Join(blocked, "cluster.key")); code != 1 || !strings.Contains(stderr, "key directory") {
		t.Fatalf("directory that cannot be made: exit %d, stderr %q; want 1", code, stderr)
	}
}

// TestKeygenMakesDirectory: `keygen --out` into a directory that does not
// exist yet (as /etc/warmfleet on a fresh node) creates it, readable by
// the owner only, and writes the key there.
func TestKeygenMakesDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "warmfleet")
	path := filepath.Join(dir, "cluster.key")
	if code, _, stderr := runCLI("keygen", "--out", path); code != 0 {
		t.Fatalf("keygen --out %s: exit %d: %s", path, code, stderr)
	}
	if _, err := gossip.LoadKeyFile(path); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, filepath.Dir(dir): 0o700, path: 0o600} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, st.Mode().Perm(), want)
		}
	}
}
