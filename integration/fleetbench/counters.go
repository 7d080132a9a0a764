package fleetbench

import (
	"context"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
)

// LinkUse is what the S3 host's link sent during a run: the bytes its
// counters saw (retransmissions included; headers once per packet the
// kernel handed the link, which with segmentation offload is fewer than
// on a real wire) and when all but the last 0.1% of them were out. Warm
// time minus BusySeconds is how long the fleet took to spread the last
// bytes read from S3.
type LinkUse struct {
	SentBytes   int64   `json:"sent_bytes"`
	BusySeconds float64 `json:"busy_seconds"`
}

// linkUse reduces a link's cumulative sent bytes, sampled from the start
// of a run, to its LinkUse.
func linkUse(sent []Sample) LinkUse {
	if len(sent) == 0 {
		return LinkUse{}
	}
	total := sent[len(sent)-1].Bytes
	u := LinkUse{SentBytes: total}
	for _, s := range sent {
		if s.Bytes >= total-total/1000 {
			u.BusySeconds = s.Seconds
			break
		}
	}
	return u
}

// s3SampleEvery is how often the S3 host's sent bytes are read in every
// run: finely enough to place the end of its busy time.
const s3SampleEvery = 100 * time.Millisecond

// Sample is a point of a link counter's timeline.
type Sample struct {
	Seconds float64 `json:"t"`
	// Bytes counted since the run began: received, in a host's timeline.
	Bytes int64 `json:"rx_bytes"`
}

// Losses are what the network lost during a run: the S3 host's TCP
// retransmissions, and the packets the link shapers dropped. A packet the
// kernel handed over whole for segmentation offload counts once as a drop,
// however many segments it held, so drops undercount lost segments.
type Losses struct {
	S3Segments      uint64 `json:"s3_segments"`      // TCP segments the S3 host sent, retransmissions not included
	S3Retransmitted uint64 `json:"s3_retransmitted"` // TCP segments the S3 host sent again
	S3UplinkDrops   uint64 `json:"s3_uplink_drops"`  // dropped on the S3 host's way out
	DownlinkDrops   uint64 `json:"downlink_drops"`   // dropped on the way into the run's hosts, summed
	UplinkDrops     uint64 `json:"uplink_drops"`     // dropped on the way out of the run's hosts, summed
}

// lossCounters are the cumulative counters Losses are the difference of.
type lossCounters struct {
	s3     netlab.TCPCounters
	s3Link netlab.LinkDrops
	hosts  netlab.LinkDrops // summed
}

func readLossCounters(ctx context.Context, lab *netlab.Lab, hosts []*netlab.Host) (lossCounters, error) {
	var c lossCounters
	var err error
	if c.s3, err = lab.S3().TCPCounters(); err != nil {
		return c, err
	}
	if c.s3Link, err = lab.S3().Link().Drops(ctx); err != nil {
		return c, err
	}
	for _, h := range hosts {
		d, err := h.Link().Drops(ctx)
		if err != nil {
			return c, err
		}
		c.hosts.Up += d.Up
		c.hosts.Down += d.Down
	}
	return c, nil
}

// since is what was lost between the counters in before and c.
func (c lossCounters) since(before lossCounters) Losses {
	return Losses{
		S3Segments:      c.s3.OutSegs - before.s3.OutSegs,
		S3Retransmitted: c.s3.RetransSegs - before.s3.RetransSegs,
		S3UplinkDrops:   c.s3Link.Up - before.s3Link.Up,
		DownlinkDrops:   c.hosts.Down - before.hosts.Down,
		UplinkDrops:     c.hosts.Up - before.hosts.Up,
	}
}

// RetransmitShare is the share of the S3 host's segments that were
// retransmissions.
func (l Losses) RetransmitShare() float64 {
	if sent := l.S3Segments + l.S3Retransmitted; sent > 0 {
		return float64(l.S3Retransmitted) / float64(sent)
	}
	return 0
}

// sampleCounters reads each counter every interval from start until the
// returned stop is called; stop returns each counter's samples, counted
// from its first reading. A zero interval samples nothing.
func sampleCounters(every time.Duration, start time.Time, counters []func() (int64, error)) (stop func() [][]Sample) {
	samples := make([][]Sample, len(counters))
	if every <= 0 {
		return func() [][]Sample { return samples }
	}
	base := make([]int64, len(counters))
	for i, read := range counters {
		base[i], _ = read()
	}
	sample := func() {
		t := time.Since(start).Seconds()
		for i, read := range counters {
			if v, err := read(); err == nil {
				samples[i] = append(samples[i], Sample{Seconds: t, Bytes: v - base[i]})
			}
		}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(every)
		defer tick.Stop()
		sample()
		for {
			select {
			case <-done:
				sample()
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	return func() [][]Sample {
		close(done)
		<-finished
		return samples
	}
}

// linkCounter reads one of a host's link counters: its received or its
// sent bytes.
func linkCounter(h *netlab.Host, sent bool) func() (int64, error) {
	return func() (int64, error) {
		c, err := h.Link().Counters(context.Background())
		if sent {
			return int64(c.TxBytes), err
		}
		return int64(c.RxBytes), err
	}
}
