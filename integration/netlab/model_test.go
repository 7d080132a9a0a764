package netlab

import (
	"os"
	"path/filepath"
	"testing"
)

func TestModelData(t *testing.T) {
	m, data, err := ModelData(3, 1000, 7)
	if err != nil {
		t.Fatal(err)
	}
	if m.Size() != 1000 || len(m.Files) != 3 || m.Files[0].Size != 334 || m.Files[2].Name != "model-00003.safetensors" {
		t.Fatalf("model %+v, want 1000 bytes in 334+333+333", m)
	}
	dir := t.TempDir()
	for name, b := range data {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Verify(dir); err != nil {
		t.Fatal(err)
	}
	if again, _, _ := ModelData(3, 1000, 7); again.Files[1].SHA256 != m.Files[1].SHA256 {
		t.Error("same seed, other bytes")
	}
	if other, _, _ := ModelData(3, 1000, 8); other.Files[1].SHA256 == m.Files[1].SHA256 {
		t.Error("another seed, same bytes")
	}
	if _, _, err := ModelData(3, 2, 7); err == nil {
		t.Error("3 files of 2 bytes accepted")
	}
	if m.URL = "hf://o/m"; m.Source() != "hf://o/m" {
		t.Errorf("Source() = %q with a URL", m.Source())
	}
}
