package netlab

import "testing"

const snmpText = `Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 1000
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 10 20 0 1 3 500000 765747 23184 0 4 0
Udp: InDatagrams NoPorts
Udp: 5 0
`

func TestParseSNMP(t *testing.T) {
	got, err := parseSNMP(snmpText)
	if err != nil || got != (TCPCounters{OutSegs: 765747, RetransSegs: 23184}) {
		t.Errorf("parseSNMP = %+v, %v", got, err)
	}
	for name, bad := range map[string]string{
		"no Tcp lines":     "Ip: Forwarding\nIp: 1\n",
		"names only":       "Tcp: OutSegs RetransSegs\n",
		"ragged":           "Tcp: OutSegs RetransSegs\nTcp: 1\n",
		"missing counter":  "Tcp: OutSegs InSegs\nTcp: 1 2\n",
		"not a number":     "Tcp: OutSegs RetransSegs\nTcp: 1 x\n",
		"negative counter": "Tcp: OutSegs RetransSegs\nTcp: 1 -2\n",
		"three Tcp lines":  "Tcp: OutSegs RetransSegs\nTcp: 1 2\nTcp: 3 4\n",
	} {
		if _, err := parseSNMP(bad); err == nil {
			t.Errorf("%s: parseSNMP succeeded, want error", name)
		}
	}
}

func FuzzParseSNMP(f *testing.F) {
	f.Add(snmpText)
	f.Add("Tcp: OutSegs RetransSegs\nTcp: 1 2\n")
	f.Fuzz(func(t *testing.T, text string) {
		c, err := parseSNMP(text)
		if err != nil && c != (TCPCounters{}) {
			t.Errorf("error %v with counters %+v", err, c)
		}
	})
}

func TestParseQdiscDrops(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want uint64
		ok   bool
	}{
		{"tbf", `[{"kind":"tbf","handle":"8001:","root":true,"refcnt":2,"options":{"rate":25000000,"burst":100000,"lat":16000},"bytes":1156055538,"packets":765675,"drops":233,"overlimits":372297,"requeues":0,"backlog":0,"qlen":0}]`, 233, true},
		{"several qdiscs add up", `[{"kind":"tbf","drops":2},{"kind":"ingress","drops":3}]`, 5, true},
		{"no qdisc", `[]`, 0, true},
		{"without -s", `[{"kind":"tbf","handle":"8001:"}]`, 0, false},
		{"not json", `qdisc tbf 8001: root`, 0, false},
		{"negative", `[{"kind":"tbf","drops":-1}]`, 0, false},
	}
	for _, tt := range tests {
		got, err := parseQdiscDrops([]byte(tt.out))
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("%s: parseQdiscDrops = %d, %v; want %d, ok %v", tt.name, got, err, tt.want, tt.ok)
		}
	}
}

func FuzzParseQdiscDrops(f *testing.F) {
	f.Add([]byte(`[{"kind":"tbf","drops":233}]`))
	f.Add([]byte(`[{"kind":"tbf"}]`))
	f.Fuzz(func(t *testing.T, out []byte) {
		if n, err := parseQdiscDrops(out); err != nil && n != 0 {
			t.Errorf("error %v with %d drops", err, n)
		}
	})
}
