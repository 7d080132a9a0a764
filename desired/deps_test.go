package desired

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoTransport asserts, from `go list -deps`, that the desired
// state links neither the transport that carries it nor anything above it:
// a daemon without gossip uses it as it is.
func TestImportsNoTransport(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %d packages: %q", len(deps), out)
	}
	for _, dep := range deps {
		for _, bad := range []string{"github.com/hashicorp/memberlist", "github.com/warmfleet/warmfleet/gossip", "github.com/warmfleet/warmfleet/daemon"} {
			if dep == bad || strings.HasPrefix(dep, bad+"/") {
				t.Errorf("package desired links %s", dep)
			}
		}
	}
}
