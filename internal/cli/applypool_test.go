package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/daemon"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// TestApplyDirNodePools: two node pools mount their own ConfigMaps at one
// path. The daemon of pool gpu-a sees, through the fleet's desired state,
// what pool gpu-b's daemons applied from a file it does not have; with
// --apply-pool it leaves that alone (without pools it took the file for
// one of its own that was removed, and pruned it), and still prunes its
// own removed file.
func TestApplyDirNodePools(t *testing.T) {
	const poolA, poolB = "gpu-a", "gpu-b"
	cm := &configMapDir{t: t, dir: t.TempDir()}
	cm.update(map[string]string{"pool-a.yaml": applyA})
	sock, cl := startApplyDaemon(t, "--apply-dir", cm.dir, "--apply-pool", poolA, "--apply-interval", "50ms")
	ownerA := daemon.ApplyDirOwner(poolA, cm.dir, "pool-a.yaml")
	wait.For(t, "model-a applied as pool gpu-a's file", func() bool { return modelOwners(t, cl)["model-a"] == ownerA })

	// What a gpu-b daemon applies from its own ConfigMap at the same path
	// reaches this daemon as gossip does: in the desired state, with its
	// owner.
	ownerB := daemon.ApplyDirOwner(poolB, cm.dir, "pool-b.yaml")
	if code, out, errOut := applyCLI(t, sock, applyB, "apply", "-f", "-", "--owner", ownerB, "--prune"); code != 0 {
		t.Fatalf("apply as pool gpu-b's file: exit %d\n%s%s", code, out, errOut)
	}
	// A later round (it applies model-c) has seen gpu-b's owner: model-b
	// must still be there.
	applyC := strings.ReplaceAll(applyA, "model-a", "model-c")
	cm.update(map[string]string{"pool-a.yaml": applyA, "more.yaml": applyC})
	wait.For(t, "model-c applied", func() bool { _, ok := modelOwners(t, cl)["model-c"]; return ok })
	if got := modelOwners(t, cl); got["model-b"] != ownerB {
		t.Fatalf("pool gpu-a's daemon pruned pool gpu-b's cache: owners %v", got)
	}
	// Its own removed file it prunes.
	cm.update(map[string]string{"more.yaml": applyC})
	wait.For(t, "model-a pruned with its file", func() bool { _, ok := modelOwners(t, cl)["model-a"]; return !ok })
	if got := modelOwners(t, cl); got["model-b"] != ownerB || got["model-c"] != daemon.ApplyDirOwner(poolA, cm.dir, "more.yaml") {
		t.Fatalf("after pool gpu-a's file went: owners %v", got)
	}
	if code, _, errOut := applyCLI(t, sock, "", "daemon", "--apply-dir", cm.dir, "--apply-pool", "GPU A", "--data-dir", filepath.Join(t.TempDir(), "d")); code != exitUsage || !strings.Contains(errOut, "--apply-pool") {
		t.Fatalf("daemon --apply-pool 'GPU A': exit %d %s", code, errOut)
	}
}
