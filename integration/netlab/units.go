package netlab

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Rate is a link rate in bits per second. Zero means unshaped.
type Rate uint64

// Common rates.
const (
	Kbit Rate = 1000
	Mbit Rate = 1000 * Kbit
	Gbit Rate = 1000 * Mbit
)

// BytesPerSecond is the rate in bytes per second.
func (r Rate) BytesPerSecond() float64 { return float64(r) / 8 }

// String formats the rate the way tc and the flags spell it (200mbit).
func (r Rate) String() string {
	switch {
	case r == 0:
		return "unshaped"
	case r%Gbit == 0:
		return strconv.FormatUint(uint64(r/Gbit), 10) + "gbit"
	case r%Mbit == 0:
		return strconv.FormatUint(uint64(r/Mbit), 10) + "mbit"
	case r%Kbit == 0:
		return strconv.FormatUint(uint64(r/Kbit), 10) + "kbit"
	}
	return strconv.FormatUint(uint64(r), 10) + "bit"
}

// Set implements flag.Value.
func (r *Rate) Set(s string) error {
	v, err := ParseRate(s)
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Limits that keep shaped links within what tc accepts and tests can use.
const (
	minRate = 8 * Kbit
	maxRate = 100 * Gbit
)

// ParseRate parses a tc-style rate: a number followed by bit, kbit, mbit or
// gbit (decimal units, case-insensitive), e.g. "200mbit" or "1.5gbit".
func ParseRate(s string) (Rate, error) {
	num, unit := splitNumber(strings.ToLower(strings.TrimSpace(s)))
	mult := map[string]float64{"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[unit]
	if num == "" || mult == 0 {
		return 0, fmt.Errorf("rate %q: want a number and a unit of bit, kbit, mbit or gbit (e.g. 200mbit)", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("rate %q: bad number %q", s, num)
	}
	v := f * mult
	if v < float64(minRate) || v > float64(maxRate) {
		return 0, fmt.Errorf("rate %q: must be between %s and %s", s, minRate, maxRate)
	}
	return Rate(math.Round(v)), nil
}

// Size is a number of bytes.
type Size int64

// String formats the size with the largest binary unit that divides it.
func (z Size) String() string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, i := int64(z), 0
	for v != 0 && v%1024 == 0 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return strconv.FormatInt(v, 10) + units[i]
}

// splitNumber splits "12.5mbit" into "12.5" and "mbit".
func splitNumber(s string) (num, unit string) {
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimSpace(s[i:])
}

// Human formats the size with one decimal in the largest fitting binary
// unit (1.5GiB).
func (z Size) Human() string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, i := float64(z), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return strconv.FormatInt(int64(z), 10) + "B"
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + units[i]
}
