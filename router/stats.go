package router

import (
	"slices"
	"time"
)

// ttftWindow is how many of a backend's latest first-byte latencies its
// percentiles are taken over: recent enough to follow a backend that slows
// down, enough for a p99 that means something.
const ttftWindow = 512

// backendStats is what the status page shows per backend beyond its load:
// how many requests it got, how much of their prompts it was expected to
// hold cached, and how soon it answered.
type backendStats struct {
	requests     uint64
	promptBlocks uint64
	cachedBlocks uint64
	ttft         []time.Duration // ring of the latest ttftWindow samples
	ttftNext     int
}

// routed counts one request sent with blocks prompt blocks, matched of
// them expected cached on the backend.
func (s *backendStats) routed(blocks, matched int) {
	s.requests++
	s.promptBlocks += uint64(max(blocks, 0))
	s.cachedBlocks += uint64(min(max(matched, 0), max(blocks, 0)))
}

// firstByte records one time from sending a request to the backend's
// first response byte.
func (s *backendStats) firstByte(d time.Duration) {
	if len(s.ttft) < ttftWindow {
		s.ttft = append(s.ttft, d)
		return
	}
	s.ttft[s.ttftNext] = d
	s.ttftNext = (s.ttftNext + 1) % ttftWindow
}

// Latency is a backend's recent time to first byte, in seconds.
type Latency struct {
	P50     float64 `json:"p50"`
	P90     float64 `json:"p90"`
	P99     float64 `json:"p99"`
	Samples int     `json:"samples"`
}

// latency summarizes samples by nearest rank; nil when there are none.
func latency(samples []time.Duration) *Latency {
	if len(samples) == 0 {
		return nil
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := func(q float64) float64 {
		i := int(q*float64(len(s))+0.999999) - 1 // ceil(q*n)-1, nearest rank
		return s[min(max(i, 0), len(s)-1)].Seconds()
	}
	return &Latency{P50: rank(0.50), P90: rank(0.90), P99: rank(0.99), Samples: len(s)}
}

// hitRate is the fraction of prompt blocks expected cached where they
// were sent; 0 before any prompt.
func (s *backendStats) hitRate() float64 {
	if s.promptBlocks == 0 {
		return 0
	}
	return float64(s.cachedBlocks) / float64(s.promptBlocks)
}
