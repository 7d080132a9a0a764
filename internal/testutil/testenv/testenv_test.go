package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// RepoRoot counts directories up from this file: moving the package must
// move the count with it, or every tool in bin/ goes missing and the tests
// that need one skip.
func TestRepoRootHoldsGoMod(t *testing.T) {
	root := RepoRoot()
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("RepoRoot() = %s, which holds no go.mod: %v", root, err)
	}
}
