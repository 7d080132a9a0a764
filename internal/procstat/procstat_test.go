package procstat

import (
	"testing"
	"time"
)

func TestParseVmHWM(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"Name:\tx\nVmPeak:\t  100 kB\nVmHWM:\t   2048 kB\nVmRSS:\t 1 kB\n", 2048 << 10, true},
		{"VmRSS:\t 1 kB\n", 0, false},
		{"VmHWM:\t lots kB\n", 0, false},
		{"VmHWM: 5 MB\n", 0, false},
		{"VmHWM: -1 kB\n", 0, false},
		{"VmHWM: 99999999999999999 kB\n", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseVmHWM([]byte(tt.in))
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseVmHWM(%q) = %d, %v", tt.in, got, err)
		}
	}
}

func FuzzParseVmHWM(f *testing.F) {
	f.Add([]byte("VmHWM:\t   2048 kB\n"))
	f.Add([]byte("VmHWM: -1 kB\n"))
	f.Add([]byte("VmHWM: 99999999999999999999 kB\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := ParseVmHWM(b); err == nil && n < 0 {
			t.Errorf("ParseVmHWM(%q) = %d", b, n)
		}
	})
}

func TestParseCPUTicks(t *testing.T) {
	// Fields after the name: state ppid pgrp session tty tpgid flags
	// minflt cminflt majflt cmajflt utime stime ...
	rest := " S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 9"
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"42 (warmfleet)" + rest, 2 * time.Second, true},
		{"42 (a) b) c)" + rest, 2 * time.Second, true}, // a name may hold ") "
		{"7 (my prog) S 1 7 7 0 -1 0 0 0 0 0 150 50 0 0 20 0", 2 * time.Second, true},
		{"42 (warmfleet) S 1 2", 0, false},
		{"42 warmfleet" + rest, 0, false},
		{"42 (x) S 1 2 3 4 5 6 7 8 9 10 -1 50", 0, false},
		{"42 (x) S 1 2 3 4 5 6 7 8 9 10 18446744073709551615 18446744073709551615", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseCPUTicks([]byte(tt.in))
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseCPUTicks(%q) = %v, %v", tt.in, got, err)
		}
	}
}

func FuzzParseCPUTicks(f *testing.F) {
	f.Add([]byte("42 (warmfleet) S 1 2 3 4 5 6 7 8 9 10 150 50 0"))
	f.Add([]byte("1 ()) R 1 1 1 1 1 1 1 1 1 1 18446744073709551615 1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := ParseCPUTicks(b); err == nil && d < 0 {
			t.Errorf("ParseCPUTicks(%q) = %v", b, d)
		}
	})
}

// TestSelf reads this test process's own figures.
func TestSelf(t *testing.T) {
	rss, err := PeakRSS(0)
	if err != nil || rss <= 0 {
		t.Fatalf("PeakRSS(self) = %d, %v", rss, err)
	}
	if _, err := CPU(0); err != nil {
		t.Fatalf("CPU(self): %v", err)
	}
}
