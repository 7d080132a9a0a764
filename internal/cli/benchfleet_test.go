package cli

import "testing"

func TestBenchFleetBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--host-procs", "-1"}, "--host-procs -1"},
		{[]string{"--settle", "-1s"}, "--settle -1s"},
		{[]string{"--settle", "soon"}, "settle"},
		{[]string{"--mtu", "100"}, "--mtu 100"},
		{[]string{"-o", "yaml"}, `-o "yaml"`},
	}
	for _, tt := range tests {
		assertUsageError(t, append([]string{"bench", "fleet"}, tt.args...), tt.want)
	}
}
