package testclock

import (
	"testing"
	"time"
)

func TestClockMovesOnlyWhenTold(t *testing.T) {
	c := New()
	if got := c.Now(); !got.Equal(Start) {
		t.Fatalf("new clock at %v, want %v", got, Start)
	}
	if got := c.Now(); !got.Equal(Start) {
		t.Fatalf("clock moved by itself to %v", got)
	}
	c.Advance(time.Hour)
	if got, want := c.Now(), Start.Add(time.Hour); !got.Equal(want) {
		t.Fatalf("after Advance(1h): %v, want %v", got, want)
	}
	c.Advance(-2 * time.Hour)
	if got, want := c.Now(), Start.Add(-time.Hour); !got.Equal(want) {
		t.Fatalf("after Advance(-2h): %v, want %v", got, want)
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c.Set(at)
	if got := c.Now(); !got.Equal(at) {
		t.Fatalf("after Set: %v, want %v", got, at)
	}
}
