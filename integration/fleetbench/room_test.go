package fleetbench

import (
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/nvme"
)

func TestRoomFor(t *testing.T) {
	const gib = int64(1) << 30
	disk := func(total, free int64) nvme.Space { return nvme.Space{Total: total * gib, Free: free * gib} }
	tests := []struct {
		name    string
		hosts   int
		space   nvme.Space
		model   int64
		reserve bool
		want    string // "" fits; else a part of the error
	}{
		{name: "fits with the reserve", hosts: 8, space: disk(100, 14), model: gib, reserve: true},
		// 5% of 100 GiB is the larger reserve: 8 + 5 > 12.
		{name: "short by the reserve", hosts: 8, space: disk(100, 12), model: gib, reserve: true,
			want: "has 12.0 GiB free; 8 hosts caching 1.0 GiB each and the daemon's default reserve (5.0 GiB) need 13.0 GiB"},
		// On a small disk 1 GiB is the larger reserve.
		{name: "small disk", hosts: 2, space: nvme.Space{Total: 10 * gib, Free: 3 * gib / 2}, model: gib / 2, reserve: true, want: "has 1.5 GiB free; 2 hosts caching 512.0 MiB each and the daemon's default reserve (1.0 GiB) need 2.0 GiB"},
		{name: "reserve set by the daemon's flags", hosts: 8, space: disk(100, 8), model: gib, reserve: false},
		{name: "short without the reserve", hosts: 8, space: disk(100, 7), model: gib, reserve: false, want: "has 7.0 GiB free; 8 hosts caching 1.0 GiB each need 8.0 GiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := roomFor(&fsRoom{dir: "/data", hosts: tt.hosts, space: tt.space}, tt.model, tt.reserve)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestSetsReserve(t *testing.T) {
	for args, want := range map[string]bool{
		"":                                     false,
		"--p2p-upload-limit=23MB":              false,
		"--reserve=0":                          true,
		"--reserve 0":                          true,
		"-reserve-fraction=0":                  true,
		"--reserved-for-later":                 false,
		"--log-level=debug --reserve-fraction": true,
		"reserve":                              false, // a value, not a flag
	} {
		if got := setsReserve(strings.Fields(args)); got != want {
			t.Errorf("setsReserve(%q) = %v, want %v", args, got, want)
		}
	}
}

// A run the disk cannot hold is refused before any daemon starts, naming
// the file system and what it lacks.
func TestCheckRoomRefusesAFullDisk(t *testing.T) {
	dir := t.TempDir()
	hosts := []*netlab.Host{{Name: "h0", DataDir: dir}, {Name: "h1", DataDir: dir}}
	if err := checkRoom(hosts, 1, nil); err != nil {
		t.Fatalf("two 1-byte copies refused: %v", err)
	}
	err := checkRoom(hosts, 1<<50, []string{"--reserve=0"})
	if err == nil || !strings.Contains(err.Error(), "the file system of "+dir) || !strings.Contains(err.Error(), "2 hosts caching") {
		t.Fatalf("got %v, want the file system of %s refused for 2 hosts", err, dir)
	}
}
