package gossip

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsCountersStartAtZero: before any message, the dropped and
// received counters have a zero series for every reason and message type,
// so the first drop shows as an increase and the counters' kind is visible
// in what the collector collects.
func TestMetricsCountersStartAtZero(t *testing.T) {
	for b := 1; b < 256; b++ {
		if mt := msgType(b); !strings.HasPrefix(mt.String(), "type-") && !slices.Contains(receivedTypes, mt) {
			t.Errorf("message type %s is missing from receivedTypes", mt)
		}
	}
	m := newNodeMetrics(nil)
	if n := testutil.CollectAndCount(m.dropped); n != len(dropReasons) {
		t.Errorf("dropped: %d series before any message, want %d", n, len(dropReasons))
	}
	if n := testutil.CollectAndCount(m.received); n != len(receivedTypes) {
		t.Errorf("received: %d series before any message, want %d", n, len(receivedTypes))
	}
	for _, r := range dropReasons {
		if v := testutil.ToFloat64(m.dropped.WithLabelValues(r)); v != 0 {
			t.Errorf("dropped{reason=%q} = %v, want 0", r, v)
		}
	}
}
