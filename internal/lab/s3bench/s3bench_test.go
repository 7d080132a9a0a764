package s3bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/synthmodel"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

func TestQuantile(t *testing.T) {
	s := func(ds ...time.Duration) []Sample {
		var out []Sample
		for _, d := range ds {
			out = append(out, Sample{Duration: d})
		}
		return out
	}
	tests := []struct {
		samples          []Sample
		median, min, max time.Duration
	}{
		{s(3, 1, 2), 2, 1, 3},
		{s(4, 1, 3, 2), 2, 1, 4},
		{s(5), 5, 5, 5},
		{nil, 0, 0, 0},
	}
	for _, tt := range tests {
		r := Result{Samples: tt.samples}
		if r.Median() != tt.median || r.Min() != tt.min || r.Max() != tt.max {
			t.Errorf("%v: median %v min %v max %v", tt.samples, r.Median(), r.Min(), r.Max())
		}
	}
}

func TestMetricValue(t *testing.T) {
	text := "# HELP warmfleet_s3_bytes_total x\n# TYPE warmfleet_s3_bytes_total counter\n" +
		"warmfleet_s3_bytes_total_other 7\nwarmfleet_s3_bytes_total 2.147483648e+09\n"
	if v, err := metricValue(text, "warmfleet_s3_bytes_total"); err != nil || v != 1<<31 {
		t.Errorf("got %v, %v", v, err)
	}
	for _, bad := range []string{"", "warmfleet_s3_bytes_total \n", "warmfleet_s3_bytes_total lots\n"} {
		if _, err := metricValue(bad, "warmfleet_s3_bytes_total"); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseFilefrag(t *testing.T) {
	tests := []struct {
		in    string
		files int
		want  int
		ok    bool
	}{
		{"/d/a: 1 extent found\n/d/b c: 12 extents found\n", 2, 13, true},
		{"/d/a: 0 extents found", 1, 0, true},
		{"/d/a: 1 extent found\n", 2, 0, false}, // a file missing
		{"/d/a: many extents found\n", 1, 0, false},
		{"/d/a: -1 extents found\n", 1, 0, false},
		{"filefrag: cannot open\n", 1, 0, false},
		{"", 1, 0, false},
	}
	for _, tt := range tests {
		got, err := parseFilefrag([]byte(tt.in), tt.files)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseFilefrag(%q, %d) = %d, %v", tt.in, tt.files, got, err)
		}
	}
}

func FuzzParseFilefrag(f *testing.F) {
	f.Add([]byte("/d/a: 1 extent found\n/d/b: 12 extents found\n"), 2)
	f.Fuzz(func(t *testing.T, b []byte, files int) {
		if n, err := parseFilefrag(b, files); err == nil && n < 0 {
			t.Errorf("parseFilefrag(%q) = %d", b, n)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	bad := []Config{
		{},
		{Dir: "x", Runs: -1},
		{Dir: "x", Methods: []string{"ftp"}},
		{Dir: "x", Methods: []string{MethodPlain, MethodPlain}},
		{Dir: "x", Methods: []string{MethodDaemon}}, // no binary
		{Dir: "x", Concurrency: -1},
		{Dir: "x", ReadRuns: 101},
	}
	for _, c := range bad {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	c, err := Config{Dir: "x", DaemonBin: "/bin/warmfleet"}.withDefaults()
	if err != nil || len(c.Methods) != len(AllMethods()) {
		t.Errorf("defaults: %+v, %v", c, err)
	}
}

func TestSpaceNeeded(t *testing.T) {
	tests := []struct {
		cfg  Config
		want int64
	}{
		{Config{Size: 1 << 30, Methods: []string{MethodPlain}}, 2<<30 + 64<<20},
		{Config{Size: 1 << 30, Methods: []string{MethodDaemon}}, 3<<30 + 64<<20},
		{Config{Size: 1 << 30, Methods: []string{MethodDaemon}, ReadBack: true}, 4<<30 + 64<<20},
		{Config{Size: 1 << 30, Methods: []string{MethodPlain}, ReadBack: true}, 2<<30 + 64<<20},
	}
	for _, tt := range tests {
		if got := spaceNeeded(tt.cfg); got != tt.want {
			t.Errorf("spaceNeeded(%+v) = %d, want %d", tt.cfg, got, tt.want)
		}
	}
}

func samples(ds ...time.Duration) []Sample {
	var out []Sample
	for _, d := range ds {
		out = append(out, Sample{Duration: d, CPU: d / 2, PeakRSS: int64(d)})
	}
	return out
}

func TestSpeedup(t *testing.T) {
	rep := &Report{Results: []Result{
		{Method: MethodDaemon, Samples: samples(2*time.Second, 3*time.Second, 9*time.Second)},
		{Method: MethodPlain, Samples: samples(6 * time.Second)},
		{Method: MethodRclone, Note: "not installed"},
	}}
	if got := rep.Speedup(MethodDaemon, MethodPlain); got != 2 {
		t.Errorf("daemon vs plain %v, want 2", got)
	}
	if got := rep.Speedup(MethodDaemon, MethodRclone); got != 0 {
		t.Errorf("daemon vs skipped rclone %v, want 0", got)
	}
	if got := rep.Speedup(MethodDaemon, MethodS3Origin); got != 0 {
		t.Errorf("daemon vs absent s3origin %v, want 0", got)
	}
	rr := ReaderResult{Cached: Result{Samples: samples(4 * time.Second)}, DD: Result{Samples: samples(3 * time.Second)}}
	if got := rr.Ratio(); got != 0.75 {
		t.Errorf("read-back ratio %v, want 0.75 (cached slower)", got)
	}
}

// The report's two forms carry the same figures.
func TestWriteReport(t *testing.T) {
	rep := &Report{
		Bytes: 1 << 30, Files: 4, Config: Config{Runs: 3, Concurrency: 8, PartSize: 16 << 20}, CPUs: 2,
		LoadStart: "1.00 2.00 3.00", LoadEnd: "4.00 5.00 6.00",
		Results: []Result{
			{Method: MethodDaemon, Command: "warmfleet daemon", Samples: []Sample{{Duration: 2 * time.Second, PeakRSS: 50 << 20, S3Bytes: 1 << 30}}},
			{Method: MethodPlain, Samples: []Sample{{Duration: 3 * time.Second, Sync: 3 * time.Second}}},
			{Method: MethodRclone, Samples: samples(4 * time.Second)},
		},
		ReadBack: &ReadBack{Bytes: 1 << 30, Note: "warm", Runs: 5, CachedExtents: 17, DDExtents: 3, Readers: []ReaderResult{
			{Reader: "sequential", Cached: Result{Samples: samples(time.Second)}, DD: Result{Samples: samples(time.Second)}},
		}},
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1.50x", "2.00x", "3.00x", "4.00 5.00 6.00", "1.000x", "warm", "1073741824", "cached 17, dd 3"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Methods []struct {
			Method   string  `json:"method"`
			VsPlain  float64 `json:"vs_plain"`
			VsRclone float64 `json:"vs_rclone"`
			PeakRSS  int64   `json:"peak_rss_bytes"`
			Durable  float64 `json:"durable_vs_plain"`
		} `json:"methods"`
		ReadBack struct {
			Cold    bool `json:"cold_cache"`
			Readers []struct {
				Ratio float64 `json:"cached_over_dd"`
			} `json:"readers"`
		} `json:"read_back"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	if len(got.Methods) != 3 || got.Methods[0].VsPlain != 1.5 || got.Methods[0].VsRclone != 2 || got.Methods[0].PeakRSS != 50<<20 || got.Methods[0].Durable != 3 {
		t.Errorf("JSON methods %+v", got.Methods)
	}
	if got.ReadBack.Cold || len(got.ReadBack.Readers) != 1 || got.ReadBack.Readers[0].Ratio != 1 {
		t.Errorf("JSON read-back %+v", got.ReadBack)
	}
}

func writeModel(t *testing.T, size int64, shards int) (*synthmodel.Model, string, []s3origin.Object) {
	t.Helper()
	model, err := synthmodel.New(synthmodel.Options{Seed: 3, Size: size, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := model.WriteTo(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	var objs []s3origin.Object
	for _, f := range model.Files() {
		objs = append(objs, s3origin.Object{Key: prefix + f.Name, Path: f.Name, Size: f.Size})
	}
	return model, dir, objs
}

func TestCheckContent(t *testing.T) {
	model, dir, _ := writeModel(t, 9<<20, 2)
	if err := checkContent(t.Context(), dir, model); err != nil {
		t.Fatalf("intact copy: %v", err)
	}
	var shard string
	var largest int64
	for _, f := range model.Files() {
		if f.Size > largest {
			shard, largest = filepath.Join(dir, f.Name), f.Size
		}
	}
	f, err := os.OpenFile(shard, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, 3<<20); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1
	if _, err := f.WriteAt(b, 3<<20); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if err := checkContent(t.Context(), dir, model); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("flipped bit: %v", err)
	}
	if err := os.Truncate(shard, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := checkContent(t.Context(), dir, model); err == nil {
		t.Error("truncated file accepted")
	}
}

// Both readers read every byte (more than one chunk per file), and the
// read-back's dd copy holds the same bytes.
func TestReaders(t *testing.T) {
	testenv.Bin(t, "dd")
	model, dir, objs := writeModel(t, 40<<20, 2)
	var want int64
	for _, o := range objs {
		want += o.Size
	}
	for _, r := range readers() {
		if n, err := r.read(t.Context(), dir, objs); err != nil || n != want {
			t.Errorf("%s: %d bytes, %v; want %d", r.name, n, err, want)
		}
		if _, err := r.read(t.Context(), t.TempDir(), objs); err == nil {
			t.Errorf("%s: missing files accepted", r.name)
		}
	}
	dd := t.TempDir()
	for _, o := range objs {
		if err := ddCopy(t.Context(), filepath.Join(dir, o.Path), filepath.Join(dd, o.Path)); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkContent(t.Context(), dd, model); err != nil {
		t.Error(err)
	}
}

// A tiny end-to-end run of the in-process methods and rclone: the plumbing
// works and every method produces the right bytes; the figures mean nothing
// at this size. The daemon method runs in internal/cli's test of
// `warmfleet-lab bench s3`, which builds the binary.
func TestRunSmall(t *testing.T) {
	testenv.Bin(t, "versitygw")
	rep, err := Run(context.Background(), Config{Dir: t.TempDir(), Size: 6 << 20, Shards: 2, Runs: 1, PartSize: 1 << 20, Pause: -1,
		Methods: []string{MethodPlain, MethodRclone, MethodS3Origin}})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if rep.Files != 4 || rep.VerifyMethod == "" || rep.ReadBack != nil || rep.LoadStart == "" {
		t.Errorf("report %+v", rep)
	}
	for _, r := range rep.Results {
		if r.Note == "" && (len(r.Samples) != 1 || r.Samples[0].PeakRSS <= 0) {
			t.Errorf("%s: samples %+v", r.Method, r.Samples)
		}
	}
}
