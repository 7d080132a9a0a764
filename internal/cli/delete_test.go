package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/daemon/api"
)

// TestDeleteFile: `delete -f --dry-run` shows what would go and deletes
// nothing; `delete -f` deletes what the file declares and its owner
// applied (caches and the endpoint), keeps what it does not name, counts
// names the daemon lacks, and refuses, deleting nothing, when the file
// names another owner's object.
func TestDeleteFile(t *testing.T) {
	sock, cl := startApplyDaemon(t)
	dir := t.TempDir()
	all := filepath.Join(dir, "all.yaml")
	writeFile(t, all, applyA+"---\n"+applyB+"---\n"+applyImage+"---\n"+applyEndpoint)
	if code, out, errOut := applyCLI(t, sock, "", "apply", "-f", all); code != 0 {
		t.Fatalf("apply: exit %d\n%s%s", code, out, errOut)
	}
	// The file to delete names model-a, the image, the endpoint and a
	// model nobody applied; it leaves model-b out.
	file := filepath.Join(dir, "delete.yaml")
	writeFile(t, file, applyA+"---\n"+applyImage+"---\n"+applyEndpoint+"---\n"+strings.ReplaceAll(applyA, "model-a", "model-z"))
	owner := "file:" + all

	code, out, errOut := applyCLI(t, sock, "", "delete", "-f", file, "--owner", owner, "--dry-run")
	if code != 0 || !strings.HasPrefix(out, "(dry run: nothing changed)\n") || !strings.Contains(out, "- ModelCache model-a\n    source: s3://models/a/\n") ||
		!strings.Contains(out, "- Endpoint http://127.0.0.1:8000\n") ||
		!strings.Contains(out, "0 to create, 0 to update, 3 to delete, 0 unchanged, 1 not held (owner "+owner+")") {
		t.Fatalf("delete --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	if got := modelOwners(t, cl); len(got) != 2 {
		t.Fatalf("the dry run deleted: %v", got)
	}

	// As the file's own owner (the default), the objects belong to
	// another: refused, with every key named, and nothing deleted.
	code, _, errOut = applyCLI(t, sock, "", "delete", "-f", file)
	if code != exitFailure || !strings.Contains(errOut, "delete: 3 object(s) belong to another owner") ||
		!strings.Contains(errOut, "model/model-a (owner "+owner+")") {
		t.Fatalf("delete as another owner: exit %d %s", code, errOut)
	}
	if got := modelOwners(t, cl); len(got) != 2 {
		t.Fatalf("a refused delete deleted: %v", got)
	}

	code, out, errOut = applyCLI(t, sock, "", "delete", "-f", file, "--owner", owner, "-o", "json")
	var res api.ApplyResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Changes) != 3 || res.Missing != 1 || res.DryRun {
		t.Fatalf("delete -o json: exit %d\n%s%s", code, out, errOut)
	}
	if got := modelOwners(t, cl); len(got) != 1 || got["model-b"] != owner {
		t.Fatalf("after delete: caches %v, want model-b alone", got)
	}
	if eps, err := cl.Endpoints(t.Context()); err != nil || len(eps) != 0 {
		t.Fatalf("after delete: endpoints %+v, %v", eps, err)
	}
	// The image spec is gone too: applying the first file would create it.
	if code, out, _ = applyCLI(t, sock, "", "diff", "-f", all); code != 0 || !strings.Contains(out, "+ ImageCache vllm\n") ||
		!strings.Contains(out, "3 to create, 0 to update, 0 to delete, 1 unchanged") {
		t.Fatalf("diff after delete: exit %d\n%s", code, out)
	}
	// Again: nothing left to delete.
	if code, out, _ = applyCLI(t, sock, "", "delete", "-f", file, "--owner", owner); code != 0 || !strings.Contains(out, "0 to delete, 0 unchanged, 4 not held") {
		t.Fatalf("second delete: exit %d\n%s", code, out)
	}
	// A bad file deletes nothing and says where.
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, strings.Replace(applyB, "kind: ModelCache", "kind: ModelCahce", 1))
	if code, _, errOut = applyCLI(t, sock, "", "delete", "-f", bad); code != exitFailure || !strings.Contains(errOut, bad+":2:") {
		t.Fatalf("delete of a bad file: exit %d %s", code, errOut)
	}
	if code, _, errOut = applyCLI(t, sock, "", "delete"); code != exitUsage || !strings.Contains(errOut, "-f FILE|DIR|- is required") {
		t.Fatalf("delete without -f: exit %d %s", code, errOut)
	}
}
