package daemon

import (
	"testing"

	"github.com/warmfleet/warmfleet/spec"
)

// TestImageClaimsByAnySpelling: an image claim is one claim however its
// reference is spelled ("alpine", "docker.io/library/alpine:latest"), so it
// is removed by the reference `image ls` shows, and adding it twice in two
// spellings does not leave a claim behind on removal.
func TestImageClaimsByAnySpelling(t *testing.T) {
	tests := []struct {
		name   string
		add    []string
		remove string
	}{
		{"short add, full remove", []string{"alpine"}, "docker.io/library/alpine:latest"},
		{"full add, short remove", []string{"docker.io/library/alpine:3"}, "alpine:3"},
		{"two spellings, one remove", []string{"alpine:3", "docker.io/library/alpine:3"}, "library/alpine:3"},
		{"same spelling", []string{"registry.local:5000/app:v1"}, "registry.local:5000/app:v1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDaemon(t, t.TempDir(), nil)
			t.Cleanup(func() { d.Close() })
			for _, ref := range tt.add {
				if err := d.AddImage(t.Context(), spec.Spec{Kind: spec.KindImage, Name: ref, Owner: "web"}); err != nil {
					t.Fatal(err)
				}
			}
			// Another owner's claim on the same image stays.
			if err := d.AddImage(t.Context(), spec.Spec{Kind: spec.KindImage, Name: tt.add[0], Owner: "batch"}); err != nil {
				t.Fatal(err)
			}
			found, err := d.RemoveImage(t.Context(), tt.remove, "web")
			if err != nil || !found {
				t.Fatalf("RemoveImage(%q) = %t, %v; want the claim found", tt.remove, found, err)
			}
			var left []string
			for _, s := range d.desired.List() {
				if s.Kind == spec.KindImage {
					left = append(left, s.Name+"#"+s.Owner)
				}
			}
			if len(left) != 1 || left[0][len(left[0])-len("#batch"):] != "#batch" {
				t.Fatalf("claims left %q, want only batch's", left)
			}
			if found, err := d.RemoveImage(t.Context(), tt.remove, "web"); err != nil || found {
				t.Fatalf("second RemoveImage = %t, %v; want not found", found, err)
			}
		})
	}
}
