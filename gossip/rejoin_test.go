package gossip

import (
	"slices"
	"testing"
	"time"
)

// TestRejoinTargets: a whole fleet rejoins nowhere; a lone node tries its
// join list; a node whose members died without a goodbye tries the most
// recently gone of them, a bounded few, even when it is not alone (the
// two halves of a healed partition).
func TestRejoinTargets(t *testing.T) {
	t0 := time.Unix(1000, 0)
	dead := []deadMember{{"10.0.0.3:7946", t0}, {"10.0.0.4:7946", t0.Add(2 * time.Second)}, {"10.0.0.5:7946", t0.Add(time.Second)}}
	join := []string{"10.0.0.1:7946", "10.0.0.4:7946"}
	tests := []struct {
		name  string
		alone bool
		dead  []deadMember
		want  []string
	}{
		{"whole fleet", false, nil, nil},
		{"alone", true, nil, join},
		{"half of a partition", false, dead, []string{"10.0.0.4:7946", "10.0.0.5:7946"}},
		{"alone with dead members", true, dead, []string{"10.0.0.4:7946", "10.0.0.5:7946", "10.0.0.1:7946"}},
	}
	for _, tt := range tests {
		got := rejoinTargets(join, tt.alone, slices.Clone(tt.dead), 2)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: rejoinTargets = %v, want %v", tt.name, got, tt.want)
		}
	}
}
