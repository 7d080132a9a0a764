// Package bytesize is the tree's one reader and writer of byte counts for
// people: flags and config files take "512MiB", "10GB" or "1048576";
// status lines, errors and reports print "3.5 GiB".
//
// Units: KiB, MiB, GiB, TiB and the bare K, M, G, T are powers of 1024;
// KB, MB, GB, TB are powers of 1000; B or no unit is bytes. (go-humanize,
// the usual library, reads a bare K as 1000; the flags have always meant
// 1024 by it, so this small parser stays.)
package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// max bounds a parsed size well inside int64, so sums of a few stay valid.
const max = 1 << 62

var units = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
}

// Parse reads a non-negative byte count with an optional unit; surrounding
// spaces and a space before the unit are allowed.
func Parse(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	num := s
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || !(f >= 0 && f*float64(mult) <= max) { // also rejects NaN
		return 0, fmt.Errorf("size %q: want a non-negative number with an optional unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	return int64(f * float64(mult)), nil
}

// Format prints a byte count in binary units with one decimal ("1.5 GiB"),
// or in bytes below 1 KiB.
func Format(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit || m <= -unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
