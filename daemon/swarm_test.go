package daemon

import (
	"slices"
	"testing"
	"time"
)

func TestPollWait(t *testing.T) {
	for polls, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 4: manifestPoll, 200: manifestPoll, 1 << 20: manifestPoll} {
		if got := pollWait(polls); got != want {
			t.Errorf("pollWait(%d) = %v, want %v", polls, got, want)
		}
	}
}

func TestManifestAsks(t *testing.T) {
	rank := []string{"a", "b", "c", "d"}
	none := map[string]bool{}
	for _, tc := range []struct {
		name    string
		rank    []string
		self    string
		poll    int
		holders map[string]bool
		want    []string
	}{
		{"cold start, follower: only the origin", rank, "c", 0, none, []string{"a"}},
		{"cold start, origin: nobody", rank, "a", 0, none, []string{}},
		{"warm fleet: the origin and the holders, in rank order", rank, "c", 0, map[string]bool{"d": true, "b": true}, []string{"a", "b", "d"}},
		{"warm fleet, joining origin: the holders", rank, "a", 0, map[string]bool{"c": true}, []string{"c"}},
		{"later poll: the origin", rank, "c", 3, map[string]bool{"d": true}, []string{"a"}},
		{"every probeAllEvery polls: everyone else", rank, "c", probeAllEvery, none, []string{"a", "b", "d"}},
		{"ranked first after the first poll: everyone else", rank, "a", 1, none, []string{"b", "c", "d"}},
		{"alone", nil, "a", 0, none, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := manifestAsks(tc.rank, tc.self, tc.poll, tc.holders)
			if !slices.Equal(got, tc.want) {
				t.Errorf("manifestAsks(%v, %q, %d, %v) = %v, want %v", tc.rank, tc.self, tc.poll, tc.holders, got, tc.want)
			}
		})
	}
}
