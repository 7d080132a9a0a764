package netlab

import (
	"bytes"
	"slices"
	"testing"
)

func TestParseStartTicks(t *testing.T) {
	tests := []struct {
		stat string
		want uint64
		ok   bool
	}{
		{"42 (sleep) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 8192 100", 987654, true},
		{"42 (a) b) c) R 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 5 8192 100", 5, true},
		{"42 (x) S 1 2 3", 0, false},
		{"no parens", 0, false},
		{"42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 notanumber 1", 0, false},
	}
	for _, tt := range tests {
		got, ok := parseStartTicks(tt.stat)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseStartTicks(%q) = %d, %v; want %d, %v", tt.stat, got, ok, tt.want, tt.ok)
		}
	}
}

func TestOwnerAndRunID(t *testing.T) {
	tests := []struct {
		name  string
		pid   int
		ok    bool
		runID string
	}{
		{name: "wf-1234-abcd-h0", pid: 1234, ok: true, runID: "wf-1234-abcd"},
		{name: "wf-1234-abcd-br", pid: 1234, ok: true, runID: "wf-1234-abcd"},
		{name: "wfx-1234-abcd-h0", ok: false, runID: "wfx-1234-abcd"},
		{name: "wf-abc-abcd-h0", ok: false, runID: "wf-abc-abcd"},
		{name: "wf-0-abcd-h0", ok: false, runID: "wf-0-abcd"},
		{name: "wf-1234", ok: false, runID: "wf"},
		{name: "other", ok: false, runID: "other"},
	}
	for _, tt := range tests {
		pid, ok := ownerOf("wf", tt.name)
		if pid != tt.pid || ok != tt.ok {
			t.Errorf("ownerOf(%q) = %d, %v; want %d, %v", tt.name, pid, ok, tt.pid, tt.ok)
		}
		if got := runIDOf(tt.name); got != tt.runID {
			t.Errorf("runIDOf(%q) = %q, want %q", tt.name, got, tt.runID)
		}
	}
}

func TestMountInfoHas(t *testing.T) {
	const mi = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - tmpfs tmpfs rw,size=4096k\n" +
		"37 35 98:0 / /tmp/wf/h0/data rw - tmpfs tmpfs rw\n"
	for path, want := range map[string]bool{
		"/mnt/a b":          true,
		"/tmp/wf/h0/data":   true,
		"/tmp/wf/h0/data/":  true,
		"/tmp/wf/h0":        false,
		"/tmp/wf/h0/data/x": false,
	} {
		if got := mountInfoHas(mi, path); got != want {
			t.Errorf("mountInfoHas(%q) = %v, want %v", path, got, want)
		}
	}
}

func TestTBFArgs(t *testing.T) {
	tests := []struct {
		rate Rate
		want []string
	}{
		// 200 Mbit/s = 25 MB/s: 4 ms is 100 kB of bucket, 20 ms is 500 kB of queue.
		{200 * Mbit, []string{"tbf", "rate", "200000000bit", "burst", "100000", "limit", "500000"}},
		// Slow links keep a bucket of at least 16 KiB and a queue of two buckets.
		{1 * Mbit, []string{"tbf", "rate", "1000000bit", "burst", "16384", "limit", "32768"}},
	}
	for _, tt := range tests {
		if got := tbfArgs(tt.rate); !slices.Equal(got, tt.want) {
			t.Errorf("tbfArgs(%s) = %v, want %v", tt.rate, got, tt.want)
		}
	}
}

func TestParseNetDev(t *testing.T) {
	const text = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0
  eth0: 1234567    900    0    0    0     0          0         0    99999      80    0    0    0     0       0          0
`
	got, err := parseNetDev(text, "eth0")
	if err != nil || got != (LinkCounters{RxBytes: 1234567, TxBytes: 99999}) {
		t.Errorf("parseNetDev = %+v, %v", got, err)
	}
	for name, bad := range map[string]string{
		"missing device": "lo: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n",
		"short line":     "eth0: 1 2 3\n",
		"not a number":   "eth0: x 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n",
	} {
		if _, err := parseNetDev(bad, "eth0"); err == nil {
			t.Errorf("%s: parseNetDev succeeded, want error", name)
		}
	}
}

func TestFlipEvery(t *testing.T) {
	orig := bytes.Repeat([]byte{0xAA}, 25)
	// Feeding the stream in odd-sized chunks must flip the same bytes as
	// feeding it whole: every 4th byte of the stream (offsets 3, 7, ...).
	for _, chunk := range []int{1, 3, 7, 25} {
		got := slices.Clone(orig)
		m := FlipEvery(4)
		for off := 0; off < len(got); off += chunk {
			m(int64(off), got[off:min(off+chunk, len(got))])
		}
		for i := range got {
			flipped := got[i] != orig[i]
			if flipped != ((i+1)%4 == 0) {
				t.Fatalf("chunk %d: byte %d flipped=%v", chunk, i, flipped)
			}
		}
	}
}
