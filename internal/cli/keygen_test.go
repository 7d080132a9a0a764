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
	if code, _, _ := runCLI("keygen", "--out", filepath.Join(t.TempDir(), "no", "such", "dir")); code != 1 {
		t.Fatalf("bad directory: exit %d, want 1", code)
	}
}
