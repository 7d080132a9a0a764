package procstat

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// fakeProc is a /proc with one process, 42, whose status and stat files
// hold the given texts.
func fakeProc(t *testing.T, status, stat string) procfs.FS {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"status": status, "stat": stat} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := procfs.NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func TestPeakRSS(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"Name:\tx\nVmPeak:\t  100 kB\nVmHWM:\t   2048 kB\nVmRSS:\t 1 kB\n", 2048 << 10, true},
		{"Name:\tx\nVmRSS:\t 1 kB\n", 0, false},
		{"Name:\tx\nVmHWM:\t lots kB\n", 0, false},
	}
	for _, tt := range tests {
		got, err := peakRSS(fakeProc(t, tt.in, ""), 42)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("peakRSS(%q) = %d, %v", tt.in, got, err)
		}
	}
}

func TestCPU(t *testing.T) {
	// Fields after the name: state ppid pgrp session tty tpgid flags
	// minflt cminflt majflt cmajflt utime stime, then 37 more.
	tail := strings.Repeat(" 0", 37) + "\n"
	rest := " S 1 2 3 4 5 6 7 8 9 10 150 50" + tail
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"42 (warmfleet)" + rest, 2 * time.Second, true},
		{"42 (a) b) c)" + rest, 2 * time.Second, true}, // a name may hold ") "
		{"42 (warmfleet) S 1 2\n", 0, false},
		{"42 warmfleet" + rest, 0, false},
		{"42 (x) S 1 2 3 4 5 6 7 8 9 10 -1 50" + tail, 0, false},
		{"42 (x) S 1 2 3 4 5 6 7 8 9 10 18446744073709551615 18446744073709551615" + tail, 0, false},
	}
	for _, tt := range tests {
		got, err := cpu(fakeProc(t, "", tt.in), 42)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("cpu(%q) = %v, %v", tt.in, got, err)
		}
	}
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
