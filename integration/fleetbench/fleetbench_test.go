package fleetbench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
)

func TestLowerBounds(t *testing.T) {
	tests := []struct {
		name         string
		hosts        int
		size         int64
		link, s3     netlab.Rate
		swarm, naive time.Duration
	}{
		{name: "equal links", hosts: 8, size: 25_000_000, link: 200 * netlab.Mbit, s3: 200 * netlab.Mbit, swarm: time.Second, naive: 8 * time.Second},
		{name: "fast S3", hosts: 8, size: 25_000_000, link: 200 * netlab.Mbit, s3: 2 * netlab.Gbit, swarm: time.Second, naive: time.Second},
		{name: "slow S3", hosts: 2, size: 25_000_000, link: 200 * netlab.Mbit, s3: 100 * netlab.Mbit, swarm: 2 * time.Second, naive: 4 * time.Second},
		{name: "one host", hosts: 1, size: 25_000_000, link: 100 * netlab.Mbit, s3: 200 * netlab.Mbit, swarm: 2 * time.Second, naive: 2 * time.Second},
	}
	for _, tt := range tests {
		swarm, naive := LowerBounds(tt.hosts, tt.size, tt.link, tt.s3)
		if swarm != tt.swarm || naive != tt.naive {
			t.Errorf("%s: LowerBounds = %v, %v; want %v, %v", tt.name, swarm, naive, tt.swarm, tt.naive)
		}
	}
}

func TestSummarizeTakesMedianRun(t *testing.T) {
	run := func(warm float64, s3 int64, rss int64) runResult {
		return runResult{hosts: []HostResult{
			{Host: "h0", ReadySeconds: warm / 2, S3Bytes: s3, PeakRSSBytes: rss},
			{Host: "h1", ReadySeconds: warm, S3Bytes: s3, PeakRSSBytes: rss / 2},
		}, s3: LinkUse{SentBytes: 2 * s3, BusySeconds: warm - 1}, losses: Losses{S3Segments: uint64(warm) * 100, S3Retransmitted: uint64(warm)}}
	}
	runs := []runResult{run(30, 100, 10), run(10, 100, 20), run(20, 150, 40)}
	mr := summarize(modeNaive, runs, 10*time.Second, 100)
	if mr.WarmSeconds != 20 || mr.WarmRatio != 2 {
		t.Errorf("warm %v ratio %v, want the median run's 20 s and ratio 2", mr.WarmSeconds, mr.WarmRatio)
	}
	if mr.S3EgressRatio != 3 || mr.PeakRSSBytes != 40 {
		t.Errorf("s3 egress %v, peak RSS %v; want 3 (2 hosts x 150 / 100) and 40", mr.S3EgressRatio, mr.PeakRSSBytes)
	}
	if len(mr.RunSeconds) != 3 || mr.RunSeconds[0] != 30 {
		t.Errorf("run seconds %v, want all runs in run order", mr.RunSeconds)
	}
	if !mr.Available || mr.Hosts[1].ReadySeconds != 20 {
		t.Errorf("result %+v, want available with the median run's hosts", mr)
	}
	if mr.S3Link == nil || *mr.S3Link != (LinkUse{SentBytes: 300, BusySeconds: 19}) {
		t.Errorf("S3 link %+v, want the median run's", mr.S3Link)
	}
	if mr.Losses == nil || *mr.Losses != (Losses{S3Segments: 2000, S3Retransmitted: 20}) {
		t.Errorf("losses %+v, want the median run's", mr.Losses)
	}
	if mr := summarize(modeNaive, []runResult{{hosts: runs[0].hosts}}, time.Second, 100); mr.Losses != nil {
		t.Errorf("losses %+v of a run that counted none, want them left out", mr.Losses)
	}
}

func TestLossesSince(t *testing.T) {
	before := lossCounters{s3: netlab.TCPCounters{OutSegs: 100, RetransSegs: 5}, s3Link: netlab.LinkDrops{Up: 1}, hosts: netlab.LinkDrops{Up: 2, Down: 3}}
	after := lossCounters{s3: netlab.TCPCounters{OutSegs: 1100, RetransSegs: 35}, s3Link: netlab.LinkDrops{Up: 4, Down: 9}, hosts: netlab.LinkDrops{Up: 12, Down: 23}}
	got := after.since(before)
	want := Losses{S3Segments: 1000, S3Retransmitted: 30, S3UplinkDrops: 3, DownlinkDrops: 20, UplinkDrops: 10}
	if got != want {
		t.Errorf("since = %+v, want %+v", got, want)
	}
	if share := got.RetransmitShare(); share != 30.0/1030 {
		t.Errorf("retransmit share %v, want 30/1030", share)
	}
	if share := (Losses{}).RetransmitShare(); share != 0 {
		t.Errorf("retransmit share of nothing sent %v, want 0", share)
	}
}

func TestLinkUse(t *testing.T) {
	tests := []struct {
		name string
		sent []Sample
		want LinkUse
	}{
		{"nothing sampled", nil, LinkUse{}},
		{"busy until the last bytes", []Sample{{0, 0}, {1, 500}, {2, 1000}, {3, 1000}}, LinkUse{SentBytes: 1000, BusySeconds: 2}},
		{"a trickle after the bulk is left out", []Sample{{0, 0}, {1, 99_950}, {2, 100_000}}, LinkUse{SentBytes: 100_000, BusySeconds: 1}},
		{"idle link", []Sample{{0, 0}, {1, 0}}, LinkUse{BusySeconds: 0}},
	}
	for _, tt := range tests {
		if got := linkUse(tt.sent); got != tt.want {
			t.Errorf("%s: linkUse = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// TestResultShapeWithoutSwarm checks the JSON keys the issue asks for and
// that swarm figures are null, not zero, while the swarm is not available.
func TestResultShapeWithoutSwarm(t *testing.T) {
	naive := summarize(modeNaive, []runResult{{hosts: []HostResult{{Host: "h0", ReadySeconds: 4, S3Bytes: 100, PeakRSSBytes: 1 << 20}}}}, 2*time.Second, 100)
	r := Result{
		Hosts: 1, Link: "200mbit", S3Link: "200mbit", ModelBytes: 100, Files: 1, Runs: 1,
		LowerBoundSeconds: 2, NaiveWarmSeconds: naive.WarmSeconds, NaiveLowerBoundSeconds: 2,
		Modes: []ModeResult{{Mode: modeSwarm, Reason: "no swarm yet", LowerBoundSeconds: 2}, naive},
	}
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"warm_seconds", "lower_bound_seconds", "warm_ratio", "s3_egress_ratio", "naive_warm_seconds", "peak_rss_bytes"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	for _, k := range []string{"warm_seconds", "warm_ratio", "s3_egress_ratio", "peak_rss_bytes", "swarm_speedup"} {
		if m[k] != nil {
			t.Errorf("%s = %v without a swarm, want null", k, m[k])
		}
	}
	swarm := m["modes"].([]any)[0].(map[string]any)
	for _, k := range []string{"warm_seconds", "warm_ratio", "s3_egress_ratio", "peak_rss_bytes", "hosts"} {
		if v, ok := swarm[k]; ok {
			t.Errorf("unavailable swarm mode reports %s = %v, want it left out", k, v)
		}
	}
	if swarm["available"] != false || swarm["reason"] == "" {
		t.Errorf("swarm mode %v, want available=false with a reason", swarm)
	}
	if m["naive_warm_seconds"] != 4.0 {
		t.Errorf("naive_warm_seconds = %v, want 4", m["naive_warm_seconds"])
	}

	buf.Reset()
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"swarm  n/a", "not available: no swarm yet", "naive  4.0", "FROM_PEERS", "h0"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestOptionsDefaults(t *testing.T) {
	good := Options{Hosts: 3, Link: 200 * netlab.Mbit, ModelSize: 1 << 20, Files: 2, Bin: "/bin/true"}
	if err := good.defaults(); err != nil || good.S3Link != good.Link || good.Runs != 1 || good.Logger == nil {
		t.Fatalf("defaults() = %v, %+v", err, good)
	}
	for name, o := range map[string]Options{
		"no hosts":       {Hosts: 0, Link: netlab.Mbit, ModelSize: 1, Files: 1, Bin: "x"},
		"no link":        {Hosts: 1, ModelSize: 1, Files: 1, Bin: "x"},
		"no files":       {Hosts: 1, Link: netlab.Mbit, ModelSize: 1, Files: 0, Bin: "x"},
		"tiny model":     {Hosts: 1, Link: netlab.Mbit, ModelSize: 1, Files: 2, Bin: "x"},
		"negative runs":  {Hosts: 1, Link: netlab.Mbit, ModelSize: 1, Files: 1, Runs: -1, Bin: "x"},
		"no binary":      {Hosts: 1, Link: netlab.Mbit, ModelSize: 1, Files: 1},
		"too many hosts": {Hosts: 201, Link: netlab.Mbit, ModelSize: 1, Files: 1, Bin: "x"},
		"hub kept alive": {Hosts: 1, Link: netlab.Mbit, ModelSize: 1, Files: 1, Bin: "x", Origin: originHub, S3KeepAlive: true},
	} {
		if err := o.defaults(); err == nil {
			t.Errorf("%s: defaults() accepted %+v", name, o)
		}
	}
}

func TestWriteSVG(t *testing.T) {
	hosts := []HostResult{
		{Host: "h0", ReadySeconds: 2, Timeline: []Sample{{0, 0}, {1, 50}, {2, 100}}},
		{Host: "h<1>", ReadySeconds: 3, Timeline: []Sample{{0, 0}, {1.5, 40}, {3, 100}}},
	}
	r := Result{Hosts: 2, Link: "200mbit", ModelBytes: 100, Modes: []ModeResult{
		{Mode: modeSwarm, Reason: "none yet"},
		{Mode: modeNaive, Available: true, WarmSeconds: 3, LowerBoundSeconds: 1, Hosts: hosts},
	}}
	var buf bytes.Buffer
	if err := r.WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&buf)
	polylines, texts := 0, 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "polyline":
				polylines++
			case "text":
				texts++
			}
		}
	}
	if polylines != 2 || texts == 0 {
		t.Errorf("SVG has %d polylines and %d texts, want one line per host and labels", polylines, texts)
	}

	r.Modes[1].Hosts = []HostResult{{Host: "h0"}}
	if err := r.WriteSVG(&bytes.Buffer{}); err == nil {
		t.Error("WriteSVG without timelines succeeded, want an error")
	}
}

func TestOptionsOrigin(t *testing.T) {
	base := Options{Hosts: 1, Link: netlab.Mbit, ModelSize: 10, Files: 1, Bin: "warmfleet"}
	for origin, want := range map[string]string{"": "warmfleet_s3_bytes_total", "s3": "warmfleet_s3_bytes_total", "hf": `warmfleet_origin_bytes_total{source="hf"}`} {
		o := base
		o.Origin = origin
		if err := o.defaults(); err != nil || o.originBytesMetric() != want {
			t.Errorf("origin %q: %v, metric %q; want %q", origin, err, o.originBytesMetric(), want)
		}
	}
	o := base
	o.Origin = "ftp"
	if err := o.defaults(); err == nil {
		t.Error("origin ftp accepted")
	}
}

// TestRunMakesOrRefusesDir: --dir may name a directory that does not exist
// yet; one that cannot be made is refused before any lab is built.
func TestRunMakesOrRefusesDir(t *testing.T) {
	opts := Options{Hosts: 1, Link: netlab.Mbit, ModelSize: 1 << 20, Files: 1, Bin: "x", Settle: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stops Run in the page cache probe's pause, after the directory is made
	opts.Dir = filepath.Join(t.TempDir(), "new", "bench")
	if _, err := Run(ctx, opts); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run with a new --dir = %v, want it to reach the probe's pause", err)
	}
	if fi, err := os.Stat(opts.Dir); err != nil || !fi.IsDir() {
		t.Fatalf("--dir %s not made: %v", opts.Dir, err)
	}

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	opts.Dir = filepath.Join(file, "bench")
	if _, err := Run(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "keep data in "+opts.Dir) {
		t.Fatalf("Run with --dir under a file = %v, want the directory refused", err)
	}
}

// TestS3FrontKeepsConnectionsAlive: behind the front, a server that closes
// every connection after one response (as versitygw does) still serves a
// client's requests over one connection.
func TestS3FrontKeepsConnectionsAlive(t *testing.T) {
	if (&Options{}).s3Front() != nil {
		t.Fatal("a front without S3KeepAlive")
	}
	closing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, "bytes")
	}))
	defer closing.Close()
	h, err := (&Options{S3KeepAlive: true}).s3Front()(closing.URL)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	defer front.Close()
	for _, srv := range []*httptest.Server{closing, front} {
		reused := 0
		for range 3 {
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
				GotConn: func(c httptrace.GotConnInfo) {
					if c.Reused {
						reused++
					}
				},
			})
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(b) != "bytes" {
				t.Fatalf("GET %s = %q, %v", srv.URL, b, err)
			}
		}
		if want := map[bool]int{false: 0, true: 2}[srv == front]; reused != want {
			t.Errorf("through %s: %d of 3 requests on a reused connection, want %d", srv.URL, reused, want)
		}
	}
}
