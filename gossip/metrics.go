package gossip

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a message is dropped, as metric label values.
const (
	dropDecode     = "decode"     // bad frame, bad JSON, unknown type
	dropOversize   = "oversize"   // over the size limit
	dropInvalid    = "invalid"    // decoded but fails validation
	dropUnexpected = "unexpected" // a valid message where it does not belong
	dropQueueFull  = "queue_full" // our own work queue or packet buffer overflowed
	dropKeyChange  = "key_change" // metadata announcing a peer key other than the one pinned to the name
)

// nodeMetrics is the Prometheus collector of one Node. Gauges are computed
// at scrape time from the node's view, so nothing needs a ticker.
type nodeMetrics struct {
	n        *Node
	dropped  *prometheus.CounterVec
	received *prometheus.CounterVec
	// digestPulls counts records asked for because a digest showed this
	// node behind: each one is a rumor this node missed.
	digestPulls prometheus.Counter

	members, lag, behind, bytesSent, bytesRecv, packetDrops, future *prometheus.Desc
}

// dropReasons and receivedTypes are every label value of the dropped and
// received counters.
var (
	dropReasons   = []string{dropDecode, dropOversize, dropInvalid, dropUnexpected, dropQueueFull, dropKeyChange}
	receivedTypes = []msgType{msgSpecs, msgInventory, msgWant, msgInventories, msgState, msgBye, msgDigest, msgKeyOp, msgKeyAck}
)

// newNodeMetrics starts every series of the dropped and received counters
// at zero, so a scrape shows them before the first message: a rate over
// the first drop is not lost to a series that did not exist yet, and the
// collector's kind of metric is visible in what it collects (the metrics
// reference reads it there).
func newNodeMetrics(n *Node) *nodeMetrics {
	m := &nodeMetrics{
		n: n,
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_gossip_messages_dropped_total",
			Help: "Gossip messages dropped, by reason.",
		}, []string{"reason"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_gossip_messages_received_total",
			Help: "Gossip messages accepted for processing, by type.",
		}, []string{"type"}),
		digestPulls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmfleet_gossip_digest_pulls_total",
			Help: "Inventory records fetched because a digest showed this node had missed them.",
		}),
		members: prometheus.NewDesc("warmfleet_gossip_members",
			"Fleet members known to this node, by state.", []string{"state"}, nil),
		lag: prometheus.NewDesc("warmfleet_gossip_inventory_version_lag_seconds",
			"Largest gap between the newest inventory version announced by a live member and the version held here.", nil, nil),
		behind: prometheus.NewDesc("warmfleet_gossip_inventory_members_behind",
			"Live members whose newest announced inventory is not held here yet.", nil, nil),
		bytesSent: prometheus.NewDesc("warmfleet_gossip_bytes_sent_total",
			"Gossip bytes sent on the wire, by transport (packet or stream).", []string{"transport"}, nil),
		bytesRecv: prometheus.NewDesc("warmfleet_gossip_bytes_received_total",
			"Gossip bytes received on the wire, by transport (packet or stream).", []string{"transport"}, nil),
		packetDrops: prometheus.NewDesc("warmfleet_gossip_packets_overflow_total",
			"Inbound packets dropped because the receive buffer was full.", nil, nil),
		future: prometheus.NewDesc("warmfleet_gossip_desired_refused_future_total",
			"Desired-state records from peers refused because they were stamped too far ahead of this node's clock (one of the two clocks is wrong); merged once the clock is within the bound.", nil, nil),
	}
	for _, r := range dropReasons {
		m.dropped.WithLabelValues(r)
	}
	for _, t := range receivedTypes {
		m.received.WithLabelValues(t.String())
	}
	return m
}

func (m *nodeMetrics) drop(reason string) { m.dropped.WithLabelValues(reason).Inc() }

// Describe implements prometheus.Collector.
func (m *nodeMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.dropped.Describe(ch)
	m.received.Describe(ch)
	m.digestPulls.Describe(ch)
	for _, d := range []*prometheus.Desc{m.members, m.lag, m.behind, m.bytesSent, m.bytesRecv, m.packetDrops, m.future} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *nodeMetrics) Collect(ch chan<- prometheus.Metric) {
	m.dropped.Collect(ch)
	m.received.Collect(ch)
	m.digestPulls.Collect(ch)
	counts := map[MemberState]int{MemberAlive: 0, MemberSuspect: 0, MemberDead: 0, MemberLeft: 0}
	for _, mem := range m.n.Members() {
		counts[mem.State]++
	}
	for s, c := range counts {
		ch <- prometheus.MustNewConstMetric(m.members, prometheus.GaugeValue, float64(c), string(s))
	}
	lag, behind := m.n.inventoryLag()
	ch <- prometheus.MustNewConstMetric(m.lag, prometheus.GaugeValue, lag.Seconds())
	ch <- prometheus.MustNewConstMetric(m.behind, prometheus.GaugeValue, float64(behind))
	t := m.n.tr
	ch <- prometheus.MustNewConstMetric(m.bytesSent, prometheus.CounterValue, float64(t.packetSent.Load()), "packet")
	ch <- prometheus.MustNewConstMetric(m.bytesSent, prometheus.CounterValue, float64(t.streamSent.Load()), "stream")
	ch <- prometheus.MustNewConstMetric(m.bytesRecv, prometheus.CounterValue, float64(t.packetRecv.Load()), "packet")
	ch <- prometheus.MustNewConstMetric(m.bytesRecv, prometheus.CounterValue, float64(t.streamRecv.Load()), "stream")
	ch <- prometheus.MustNewConstMetric(m.packetDrops, prometheus.CounterValue, float64(t.packetDrops.Load()))
	var refused uint64
	if m.n.desired != nil {
		refused = m.n.desired.RefusedFuture()
	}
	ch <- prometheus.MustNewConstMetric(m.future, prometheus.CounterValue, float64(refused))
}
