package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// TestCacheAddPinPriority: `cache add --pin --priority N` sets the spec's
// capacity rules, shown by `cache status` and `cache ls` (table and JSON);
// an add without them sets them back; a priority out of range or a flag
// that is not a number is a usage error (exit 2) that sends nothing.
func TestCacheAddPinPriority(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	s3.PutObject(t, "models", "tiny/model.safetensors", strings.NewReader("weights"), 7)
	sock := startDaemon(t)
	status := func() api.CacheStatus {
		t.Helper()
		code, out, stderr := runCLI("cache", "status", "tiny", "--api", sock, "-o", "json")
		if code != 0 {
			t.Fatalf("cache status: exit %d: %s", code, stderr)
		}
		var st api.CacheStatus
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("cache status -o json: %v: %s", err, out)
		}
		return st
	}

	for _, bad := range [][]string{{"--priority", "1001"}, {"--priority", "-1001"}, {"--priority", "high"}, {"--pin=maybe"}} {
		code, _, stderr := runCLI(append([]string{"cache", "add", "tiny", "--source", "s3://models/tiny/", "--api", sock}, bad...)...)
		if code != exitUsage || !strings.Contains(stderr, strings.TrimPrefix(strings.SplitN(bad[0], "=", 2)[0], "--")) {
			t.Errorf("cache add %v: exit %d, stderr %q; want a usage error naming the flag", bad, code, stderr)
		}
	}
	if code, out, _ := runCLI("cache", "ls", "--api", sock, "-o", "json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("after refused adds, cache ls = %d %q: want nothing added", code, out)
	}

	code, out, stderr := runCLI("cache", "add", "tiny", "--source", "s3://models/tiny/", "--api", sock, "--pin", "--priority", "-7", "--wait")
	if code != 0 {
		t.Fatalf("cache add --pin --priority -7: exit %d: %s%s", code, out, stderr)
	}
	if st := status(); !st.Pin || st.Priority != -7 || !st.Ready {
		t.Fatalf("status pin %v priority %d ready %v, want true -7 true", st.Pin, st.Priority, st.Ready)
	}
	code, out, _ = runCLI("cache", "ls", "--api", sock)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 {
		t.Fatalf("cache ls: exit %d:\n%s", code, out)
	}
	// Columns are aligned: a value starts where its header does.
	for col, want := range map[string]string{" PIN ": "true", " PRIORITY ": "-7"} {
		i := strings.Index(lines[0], col) + 1
		if f := strings.Fields(lines[1][min(i, len(lines[1])):]); i <= 0 || len(f) == 0 || f[0] != want {
			t.Errorf("cache ls column%s: want %s in\n%s", col, want, out)
		}
	}

	if code, _, stderr := runCLI("cache", "add", "tiny", "--source", "s3://models/tiny/", "--api", sock); code != 0 {
		t.Fatalf("cache add: exit %d: %s", code, stderr)
	}
	if st := status(); st.Pin || st.Priority != 0 {
		t.Fatalf("after an add without --pin/--priority: pin %v priority %d, want false 0", st.Pin, st.Priority)
	}
}
