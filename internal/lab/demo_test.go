package lab

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// demoArgs keep the model small: the story is the same at any size.
var demoArgs = []string{"demo", "--model-size", "4MiB", "--shards", "1", "--documents", "4"}

// checkDemoStory checks the demo's output for every part of the story.
func checkDemoStory(t *testing.T, text string) {
	t.Helper()
	if !strings.Contains(text, "4 nodes ready") {
		t.Errorf("demo output does not say 4 nodes are ready:\n%s", text)
	}
	m := regexp.MustCompile(`S3 egress ratio ([0-9.]+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("demo output has no S3 egress ratio:\n%s", text)
	}
	if ratio, err := strconv.ParseFloat(m[1], 64); err != nil || ratio <= 0 || ratio > 1.05 {
		t.Errorf("S3 egress ratio %s, want (0, 1.05]: 4 nodes read the model about once in all\n%s", m[1], text)
	}
	rates := map[string]int{}
	for _, strategy := range []string{"random", "prefix-aware"} {
		m := regexp.MustCompile(`(?m)^\s+` + strategy + `\s+16\s+(\d+)%\s+[0-9.]+m?s\s+[0-9.]+m?s\s+\d+$`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("demo output has no line for the %s strategy:\n%s", strategy, text)
		}
		rates[strategy], _ = strconv.Atoi(m[1])
	}
	// Each document's first question misses everywhere: prefix-aware
	// keeps the other three on the server that saw it.
	if rates["prefix-aware"] <= rates["random"] {
		t.Errorf("prefix-aware hit rate %d%% is not above random's %d%%:\n%s", rates["prefix-aware"], rates["random"], text)
	}
	late := regexp.MustCompile(`late node node-5: ready in \S+, (\d+) bytes from S3, (.+) from peers`).FindStringSubmatch(text)
	if late == nil {
		t.Fatalf("demo output has no late node line:\n%s", text)
	}
	if late[1] != "0" || late[2] == "0 B" {
		t.Errorf("late node read %s bytes from S3 and %s from peers, want 0 from S3, all from peers:\n%s", late[1], late[2], text)
	}
}

// TestDemo runs the whole demo with --keep and checks that its output
// tells the story: 4 nodes joined, the model read from S3 about once in
// all, the router's two strategies side by side, and a late node filled
// from peers alone; that the story, which is all the demo prints without
// --keep, has plain lines (the output is not a terminal) and names no path
// (they are gone when the demo ends); and that the fleet --keep names is
// there, and its router answers, until the demo is interrupted.
func TestDemo(t *testing.T) {
	out := newOutFile(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("demo output:\n%s", out.String())
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	start := time.Now()
	go func() {
		done <- Run(ctx, append(demoArgs, "--keep"), &cli.Env{Stdout: out.f, Stderr: out.f, Getenv: func(string) string { return "" }})
	}()
	wait.For(t, "the demo to say the fleet keeps running", func() bool {
		select {
		case code := <-done:
			t.Fatalf("demo --keep exited %d before it was interrupted", code)
		default:
		}
		return strings.Contains(out.String(), "The cluster key:")
	}, wait.Timeout(3*demoTimeout))
	text := out.String()
	t.Logf("the demo told its story in %s:\n%s", time.Since(start).Round(time.Second), text)
	story, keep, ok := strings.Cut(text, "The fleet keeps running")
	if !ok {
		t.Fatal("demo --keep does not say the fleet keeps running")
	}
	checkDemoStory(t, story)
	if strings.Contains(story, "\x1b[") {
		t.Errorf("demo output is not a terminal but has escape sequences:\n%q", story)
	}
	if tmp := os.TempDir(); strings.Contains(story, tmp) || strings.Contains(story, ".sock") {
		t.Errorf("the demo's story names a path under %s or a socket, gone when it ends without --keep:\n%s", tmp, story)
	}
	for _, want := range []string{"export AWS_ACCESS_KEY_ID=", "AWS_ENDPOINT_URL_S3=http://127.0.0.1:", "export WARMFLEET_API=unix://"} {
		if !strings.Contains(keep, want) {
			t.Errorf("demo --keep output lacks %q", want)
		}
	}
	socks := regexp.MustCompile(`unix://(\S+\.sock)`).FindAllStringSubmatch(keep, -1)
	if len(socks) < 5 {
		t.Fatalf("demo --keep names %d API sockets, want one per node (5)", len(socks))
	}
	for _, s := range socks {
		if _, err := os.Stat(s[1]); err != nil {
			t.Errorf("demo --keep names %s, which is not there: %v", s[1], err)
		}
	}
	router := regexp.MustCompile(`curl -s (http://\S+)/v1/models`).FindStringSubmatch(keep)
	if router == nil {
		t.Fatal("demo --keep does not say where the router is")
	}
	resp, err := http.Get(router[1] + "/v1/models")
	if err != nil {
		t.Fatalf("the router the demo names: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the router the demo names answers /v1/models with %s", resp.Status)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("demo --keep exited %d when interrupted", code)
	}
	if _, err := os.Stat(socks[0][1]); err == nil {
		t.Errorf("%s is still there after the demo ended", socks[0][1])
	}
}

func TestPlainDue(t *testing.T) {
	p := nodeProgress{node: "node-1", state: "downloading", total: 100}
	at := func(done int64, state string) nodeProgress { q := p; q.done, q.state = done, state; return q }
	for _, c := range []struct {
		name        string
		prev, cur   nodeProgress
		first, want bool
	}{
		{"first sample", p, p, true, true},
		{"nothing changed", at(10, "downloading"), at(10, "downloading"), false, false},
		{"within a quarter", at(10, "downloading"), at(24, "downloading"), false, false},
		{"passed a quarter", at(24, "downloading"), at(25, "downloading"), false, true},
		{"state changed", at(50, "pending"), at(50, "downloading"), false, true},
		{"unknown size", nodeProgress{state: "pending"}, nodeProgress{state: "pending", done: 5}, false, false},
	} {
		if got := plainDue(c.prev, c.cur, c.first); got != c.want {
			t.Errorf("%s: plainDue = %v, want %v", c.name, got, c.want)
		}
	}
}

// outFile is a command's output: a file, which a test may read while the
// command writes, and which is not a terminal.
type outFile struct {
	t *testing.T
	f *os.File
}

func newOutFile(t *testing.T) outFile {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return outFile{t, f}
}

func (o outFile) String() string {
	b, err := os.ReadFile(o.f.Name())
	if err != nil {
		o.t.Fatal(err)
	}
	return string(b)
}
