package bytesize

import "testing"

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"1048576", 1 << 20, true},
		{"16MiB", 16 << 20, true},
		{"1.5GiB", 3 << 29, true},
		{"10GB", 10e9, true},
		{"512K", 512 << 10, true},
		{" 2 TiB ", 2 << 40, true},
		{"-1", 0, false},
		{"abc", 0, false},
		{"1e30", 0, false},
		{"MiB", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("Parse(%q) = %d, %v; want %d ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"16MiB", "1.5GiB", "-3", "NaN", "Inf"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err == nil && (n < 0 || n > max) {
			t.Fatalf("Parse(%q) = %d", s, n)
		}
	})
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 30: "3.0 GiB", -2048: "-2.0 KiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestRoundTrip: what Format prints, Parse reads back to within its
// rounding (one decimal of the unit).
func TestRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1000, 1 << 20, 3<<29 + 12345, 7 << 40} {
		got, err := Parse(Format(n))
		if err != nil || got > n+n/20+1 || got < n-n/20-1 {
			t.Errorf("Parse(Format(%d) = %q) = %d, %v", n, Format(n), got, err)
		}
	}
}
