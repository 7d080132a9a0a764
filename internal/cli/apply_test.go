package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// The documents of these tests select nodes labelled gpu=h100, which the
// test daemon is not: the specs live in the fleet's desired state and
// nothing is downloaded.
const (
	applyA = `apiVersion: warmfleet.io/v1alpha1
kind: ModelCache
metadata: {name: model-a}
spec: {source: "s3://models/a/", selector: {gpu: h100}}
`
	applyB = `apiVersion: warmfleet.io/v1alpha1
kind: ModelCache
metadata: {name: model-b}
spec: {source: "s3://models/b/", selector: {gpu: h100}, nodes: 2}
`
	applyImage = `apiVersion: warmfleet.io/v1alpha1
kind: ImageCache
metadata: {name: vllm}
spec: {image: "ghcr.io/acme/vllm:v0.6.0", selector: {gpu: h100}}
`
	applyEndpoint = `apiVersion: warmfleet.io/v1alpha1
kind: Endpoint
metadata: {name: local}
spec: {model: model-a, url: "http://127.0.0.1:8000"}
`
)

// startApplyDaemon starts a daemon (with a real S3 server in its
// environment, never asked here) and returns its socket and a client.
func startApplyDaemon(t *testing.T, extra ...string) (string, *api.Client) {
	t.Helper()
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	sock := startDaemon(t, extra...)
	cl, err := api.NewClient(sock, "")
	if err != nil {
		t.Fatal(err)
	}
	return sock, cl
}

// applyCLI runs one command against the daemon at sock, with stdin, and
// returns its exit code, stdout and stderr.
func applyCLI(t *testing.T, sock, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	code := Run(ctx, append(args, "--api", sock), &Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut, Getenv: os.Getenv})
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// modelOwners maps each desired model to who applied it ("" by hand).
func modelOwners(t *testing.T, cl *api.Client) map[string]string {
	t.Helper()
	all, err := cl.Caches(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range all {
		out[c.Name] = c.AppliedBy
	}
	return out
}

// TestApplyDiffPrune: diff changes nothing; apply creates what a file
// declares, owned by the file; applying it again changes nothing; a
// document taken out of the file stays until --prune; a cache made by
// hand is adopted; another owner's cache is refused, and never pruned.
func TestApplyDiffPrune(t *testing.T) {
	sock, cl := startApplyDaemon(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "caches.yaml")
	writeFile(t, file, applyA+"---\n"+applyB+"---\n"+applyImage+"---\n"+applyEndpoint)
	owner := "file:" + file

	code, out, errOut := applyCLI(t, sock, "", "diff", "-f", file)
	if code != 0 || !strings.Contains(out, "+ ModelCache model-a\n    source: s3://models/a/\n") ||
		!strings.Contains(out, "+ ImageCache vllm\n    image: ghcr.io/acme/vllm:v0.6.0\n") ||
		!strings.Contains(out, "4 to create, 0 to update, 0 to delete, 0 unchanged (owner "+owner+")") {
		t.Fatalf("diff: exit %d\n%s%s", code, out, errOut)
	}
	if got := modelOwners(t, cl); len(got) != 0 {
		t.Fatalf("diff changed the daemon: %v", got)
	}

	if code, out, errOut = applyCLI(t, sock, "", "apply", "-f", file); code != 0 || !strings.Contains(out, "4 to create") {
		t.Fatalf("apply: exit %d\n%s%s", code, out, errOut)
	}
	if got := modelOwners(t, cl); got["model-a"] != owner || got["model-b"] != owner {
		t.Fatalf("after apply: owners %v, want both %s", got, owner)
	}
	eps, err := cl.Endpoints(t.Context())
	if err != nil || len(eps) != 1 || eps[0].URL != "http://127.0.0.1:8000" || eps[0].AppliedBy != owner {
		t.Fatalf("endpoints after apply: %+v, %v", eps, err)
	}
	if code, out, _ = applyCLI(t, sock, "", "apply", "-f", file); code != 0 || !strings.Contains(out, "0 to create, 0 to update, 0 to delete, 4 unchanged") {
		t.Fatalf("second apply: exit %d\n%s", code, out)
	}

	// model-a leaves the file, the image's selector changes.
	writeFile(t, file, applyB+"---\n"+strings.Replace(applyImage, "h100", "a100", 1)+"---\n"+applyEndpoint)
	if code, out, _ = applyCLI(t, sock, "", "apply", "-f", file); code != 0 || !strings.Contains(out, "~ ImageCache vllm\n    selector: gpu=h100 -> gpu=a100\n") ||
		!strings.Contains(out, "0 to delete") {
		t.Fatalf("apply without prune: exit %d\n%s", code, out)
	}
	if _, ok := modelOwners(t, cl)["model-a"]; !ok {
		t.Fatal("apply without --prune deleted model-a")
	}
	if code, out, _ = applyCLI(t, sock, "", "diff", "--prune", "-f", file); code != 0 || !strings.Contains(out, "- ModelCache model-a\n") {
		t.Fatalf("diff --prune: exit %d\n%s", code, out)
	}
	if code, out, _ = applyCLI(t, sock, "", "apply", "--prune", "-f", file); code != 0 || !strings.Contains(out, "1 to delete") {
		t.Fatalf("apply --prune: exit %d\n%s", code, out)
	}
	if _, ok := modelOwners(t, cl)["model-a"]; ok {
		t.Fatal("apply --prune kept model-a")
	}

	// A cache made by hand is adopted by the first owner that declares it,
	// then belongs to it.
	if code, _, errOut = applyCLI(t, sock, "", "cache", "add", "model-a", "--source", "s3://models/a/", "--selector", "gpu=h100"); code != 0 {
		t.Fatalf("cache add: exit %d %s", code, errOut)
	}
	if code, out, errOut = applyCLI(t, sock, applyA, "apply", "-f", "-", "--owner", "team-b"); code != 0 ||
		!strings.Contains(out, "~ ModelCache model-a\n    owner: (made by hand) -> team-b\n") {
		t.Fatalf("adopt: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = applyCLI(t, sock, applyA, "apply", "-f", "-", "--owner", "team-c")
	if code != exitFailure || !strings.Contains(errOut, "belong to another owner") || !strings.Contains(errOut, "model/model-a (owner team-b)") {
		t.Fatalf("apply of team-b's cache as team-c: exit %d %s", code, errOut)
	}
	// team-c prunes everything it applied, which is nothing: team-b's and
	// the file's caches stay.
	if code, out, errOut = applyCLI(t, sock, "", "apply", "-f", "-", "--owner", "team-c", "--prune"); code != 0 || !strings.Contains(out, "0 to delete") {
		t.Fatalf("empty prune as team-c: exit %d\n%s%s", code, out, errOut)
	}
	if got := modelOwners(t, cl); got["model-a"] != "team-b" || got["model-b"] != owner {
		t.Fatalf("after team-c's prune: owners %v", got)
	}
	// stdin has no name to own by.
	if code, _, errOut = applyCLI(t, sock, applyA, "apply", "-f", "-"); code != exitUsage || !strings.Contains(errOut, "give --owner") {
		t.Fatalf("apply -f - without --owner: exit %d %s", code, errOut)
	}
}

// TestApplyBadFiles: a file with an unknown kind or field is refused with
// the line of each problem, and nothing of it is applied.
func TestApplyBadFiles(t *testing.T) {
	sock, cl := startApplyDaemon(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, applyA+"---\n"+strings.Replace(applyB, "kind: ModelCache", "kind: ModelCahce", 1)+
		"---\n"+strings.Replace(applyEndpoint, "spec: {model:", "spec: {modle:", 1))
	code, out, errOut := applyCLI(t, sock, "", "apply", "-f", bad)
	if code != exitFailure || out != "" ||
		!strings.Contains(errOut, bad+`:7: kind "ModelCahce": want one of ModelCache, ImageCache, Endpoint`) ||
		!strings.Contains(errOut, bad+`:14: spec.modle: unknown field`) {
		t.Fatalf("apply of a bad file: exit %d\nstdout %q\nstderr %s", code, out, errOut)
	}
	if got := modelOwners(t, cl); len(got) != 0 {
		t.Fatalf("a bad file applied %v", got)
	}
}

// configMapDir lays files out as a mounted ConfigMap does: each key a
// link to ..data/KEY, ..data a link to the version's hidden directory.
// Each call is one update: a new version directory, ..data swapped to it
// in one rename, links for new keys added and for gone keys removed.
type configMapDir struct {
	t       *testing.T
	dir     string
	version int
	keys    map[string]bool
}

func (c *configMapDir) update(files map[string]string) {
	t := c.t
	c.version++
	ver := filepath.Join(c.dir, "..v"+strings.Repeat("0", 3)+string(rune('0'+c.version)))
	if err := os.Mkdir(ver, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range files {
		writeFile(t, filepath.Join(ver, k), v)
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ver), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for k := range files {
		if !c.keys[k] {
			if err := os.Symlink(filepath.Join("..data", k), filepath.Join(c.dir, k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k := range c.keys {
		if _, ok := files[k]; !ok {
			if err := os.Remove(filepath.Join(c.dir, k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.keys = map[string]bool{}
	for k := range files {
		c.keys[k] = true
	}
}

// TestApplyDir: the daemon applies a watched ConfigMap directory at start
// and at each update, each file as its own owner; a broken file (or a
// broken version of a good one) applies nothing, is reported in the
// status and the metrics, and leaves what was applied before; a file
// taken out of the ConfigMap prunes what it declared.
func TestApplyDir(t *testing.T) {
	cm := &configMapDir{t: t, dir: t.TempDir()}
	cm.update(map[string]string{"caches.yaml": applyA + "---\n" + applyEndpoint})
	_, cl := startApplyDaemon(t, "--apply-dir", cm.dir, "--apply-interval", "50ms")
	owner := "apply-dir:" + filepath.Join(cm.dir, "caches.yaml")
	owners := func() map[string]string { return modelOwners(t, cl) }
	wait.For(t, "model-a applied from the directory", func() bool { return owners()["model-a"] == owner })
	if eps, err := cl.Endpoints(t.Context()); err != nil || len(eps) != 1 || eps[0].AppliedBy != owner {
		t.Fatalf("endpoints: %+v, %v", eps, err)
	}

	// An update swaps model-a for model-b.
	cm.update(map[string]string{"caches.yaml": applyB + "---\n" + applyEndpoint})
	wait.For(t, "model-b applied and model-a pruned", func() bool {
		got := owners()
		_, a := got["model-a"]
		return got["model-b"] == owner && !a
	})

	// A new file with an unknown field, and a broken version of the good
	// file: nothing of either applies; model-b stays.
	broken := strings.Replace(applyA, "source:", "sourc:", 1)
	cm.update(map[string]string{"caches.yaml": applyB + "---\n" + applyEndpoint + "---\nkind: [", "broken.yaml": broken})
	var st api.ApplyDirStatus
	wait.For(t, "both files reported broken", func() bool {
		var err error
		st, err = cl.ApplyDir(t.Context())
		return err == nil && len(st.Files) == 2 && st.Files[0].Error != "" && st.Files[1].Error != "" &&
			st.Files[0].Digest != "" && st.Files[1].Digest != ""
	})
	if st.Files[0].File != "broken.yaml" || !strings.Contains(st.Files[0].Error, "broken.yaml:4: spec.sourc: unknown field") ||
		st.Files[1].File != "caches.yaml" || !strings.Contains(st.Files[1].Error, "caches.yaml:") || st.Files[1].Objects != 2 {
		t.Fatalf("status: %+v", st)
	}
	if got := owners(); got["model-b"] != owner || len(got) != 1 {
		t.Fatalf("after broken files: %v; want model-b alone", got)
	}
	metrics, err := cl.Metrics(t.Context())
	if err != nil || !strings.Contains(metrics, `warmfleet_apply_dir_files{state="error"} 2`) ||
		!strings.Contains(metrics, "warmfleet_apply_dir_errors_total 2") {
		t.Fatalf("metrics (%v):\n%s", err, grepLines(metrics, "warmfleet_apply_dir"))
	}

	// Fixed, and then taken out of the ConfigMap: the file's caches go,
	// the other file's stay.
	cm.update(map[string]string{"caches.yaml": applyB + "---\n" + applyEndpoint, "other.yaml": applyA})
	wait.For(t, "both files applied", func() bool {
		got := owners()
		return got["model-b"] == owner && got["model-a"] == "apply-dir:"+filepath.Join(cm.dir, "other.yaml")
	})
	cm.update(map[string]string{"other.yaml": applyA})
	// The round prunes first and then drops the file from the status: wait
	// for the status, then check what the prune left.
	wait.For(t, "caches.yaml gone from the status", func() bool {
		st, err = cl.ApplyDir(t.Context())
		return err == nil && len(st.Files) == 1
	})
	if st.Files[0].File != "other.yaml" || st.Files[0].Error != "" {
		t.Fatalf("status after removal: %+v", st)
	}
	eps, err := cl.Endpoints(t.Context())
	if got := owners(); err != nil || len(eps) != 0 || len(got) != 1 || got["model-a"] == "" {
		t.Fatalf("after removal: endpoints %+v (%v), owners %v; want model-a alone", eps, err, got)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestApplyAcrossFleet: what one daemon applies reaches the other through
// gossip, with its owner: a diff there sees nothing to do, a prune there
// removes it everywhere. Two daemons watching one ConfigMap (as a
// DaemonSet's do) apply its files as one owner and agree.
func TestApplyAcrossFleet(t *testing.T) {
	cm := &configMapDir{t: t, dir: t.TempDir()}
	cm.update(map[string]string{"caches.yaml": applyA})
	g1, g2 := testenv.FreeAddr(t), testenv.FreeAddr(t)
	dirFlags := []string{"--apply-dir", cm.dir, "--apply-interval", "50ms", "--insecure-gossip"}
	sock1, cl1 := startApplyDaemon(t, append([]string{"--node-name", "n1", "--gossip", g1}, dirFlags...)...)
	sock2 := startDaemon(t, append([]string{"--node-name", "n2", "--gossip", g2, "--join", g1}, dirFlags...)...)
	cl2, err := api.NewClient(sock2, "")
	if err != nil {
		t.Fatal(err)
	}
	owner := "apply-dir:" + filepath.Join(cm.dir, "caches.yaml")
	both := func(what string, cond func(map[string]string) bool) {
		t.Helper()
		wait.For(t, what+" on both daemons", func() bool { return cond(modelOwners(t, cl1)) && cond(modelOwners(t, cl2)) })
	}
	both("model-a from the directory", func(m map[string]string) bool { return len(m) == 1 && m["model-a"] == owner })
	cm.update(map[string]string{"caches.yaml": applyB})
	both("model-b for model-a", func(m map[string]string) bool { return len(m) == 1 && m["model-b"] == owner })

	file := filepath.Join(t.TempDir(), "team.yaml")
	writeFile(t, file, applyA)
	if code, out, errOut := applyCLI(t, sock1, "", "apply", "-f", file, "--owner", "team"); code != 0 {
		t.Fatalf("apply on n1: exit %d\n%s%s", code, out, errOut)
	}
	both("model-a applied on n1", func(m map[string]string) bool { return m["model-a"] == "team" })
	if code, out, _ := applyCLI(t, sock2, "", "diff", "-f", file, "--owner", "team"); code != 0 || !strings.Contains(out, "0 to create, 0 to update, 0 to delete, 1 unchanged") {
		t.Fatalf("diff on n2: exit %d\n%s", code, out)
	}
	if code, out, errOut := applyCLI(t, sock2, "", "apply", "-f", "-", "--owner", "team", "--prune"); code != 0 || !strings.Contains(out, "- ModelCache model-a") {
		t.Fatalf("prune on n2: exit %d\n%s%s", code, out, errOut)
	}
	both("model-a pruned, model-b kept", func(m map[string]string) bool { return len(m) == 1 && m["model-b"] == owner })
}
