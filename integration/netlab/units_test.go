package netlab

import (
	"strings"
	"testing"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in      string
		want    Rate
		wantErr string
	}{
		{in: "200mbit", want: 200 * Mbit},
		{in: "1.5Gbit", want: 1500 * Mbit},
		{in: " 64kbit ", want: 64 * Kbit},
		{in: "100000bit", want: 100 * Kbit},
		{in: "200", wantErr: "unit"},
		{in: "mbit", wantErr: "number"},
		{in: "200mb", wantErr: "unit"},
		{in: "1bit", wantErr: "between"},
		{in: "1000gbit", wantErr: "between"},
		{in: "1.2.3mbit", wantErr: "bad number"},
		{in: "", wantErr: "number"},
	}
	for _, tt := range tests {
		got, err := ParseRate(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseRate(%q) = %v, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestRateString(t *testing.T) {
	for r, want := range map[Rate]string{0: "unshaped", 200 * Mbit: "200mbit", 2 * Gbit: "2gbit", 1500 * Kbit: "1500kbit", 12345: "12345bit"} {
		if got := r.String(); got != want {
			t.Errorf("Rate(%d).String() = %q, want %q", uint64(r), got, want)
		}
		if r == 0 {
			continue
		}
		back, err := ParseRate(r.String())
		if err != nil || back != r {
			t.Errorf("ParseRate(%q) = %v, %v; want round trip to %d", r.String(), back, err, uint64(r))
		}
	}
}

func TestSizeString(t *testing.T) {
	for z, want := range map[Size]string{1 << 30: "1GiB", 3 << 10: "3KiB", 1536: "1536B", 0: "0B", 5: "5B"} {
		if got := z.String(); got != want {
			t.Errorf("Size(%d).String() = %q, want %q", int64(z), got, want)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"200mbit", "1.5gbit", "", "9e99gbit", "NaNmbit", ".mbit"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			return
		}
		if r < minRate || r > maxRate {
			t.Fatalf("ParseRate(%q) = %d outside [%d, %d]", s, uint64(r), uint64(minRate), uint64(maxRate))
		}
	})
}

func TestSizeHuman(t *testing.T) {
	for z, want := range map[Size]string{0: "0B", 1023: "1023B", 1536: "1.5KiB", 1 << 30: "1.0GiB", 6 << 20: "6.0MiB"} {
		if got := z.Human(); got != want {
			t.Errorf("Size(%d).Human() = %q, want %q", int64(z), got, want)
		}
	}
}
