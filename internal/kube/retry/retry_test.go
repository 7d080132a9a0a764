package retry

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		n    int
		u    float64
		want time.Duration
	}{
		{1, 0, time.Second},
		{2, 0, 2 * time.Second},
		{3, 0.5, 3 * time.Second},
		{7, 0, time.Minute},
		{1000, 0.999, time.Minute - time.Duration(0.999*float64(30*time.Second))},
	} {
		if got := Backoff(time.Second, time.Minute, tc.n, tc.u); got != tc.want {
			t.Errorf("Backoff(n=%d, u=%v) = %v, want %v", tc.n, tc.u, got, tc.want)
		}
	}
}
