package s3bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteText prints the report as tables: each method with its speed
// relative to PlainCopy and to rclone, then the read-back comparison.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "S3 download benchmark: %d files, %.2f GiB per run, %d runs per method, versitygw on loopback\n",
		r.Files, float64(r.Bytes)/(1<<30), r.Config.Runs)
	fmt.Fprintf(&b, "machine: %d CPUs, load average (1/5/15 min) %s at start, %s at end\n", r.CPUs, r.LoadStart, r.LoadEnd)
	plain, _ := r.Result(MethodPlain)
	rclone, _ := r.Result(MethodRclone)
	fmt.Fprintf(&b, "%-22s %9s %20s %7s %8s %10s %10s %10s %8s %9s %10s\n", "method", "median", "range", "MB/s", "CPU", "peak RSS", "vs plain", "vs rclone",
		"+sync", "durable", "dur. vs plain")
	rows := slices.Clone(r.Results)
	if len(r.Verify.Samples) > 0 {
		rows = append(rows, r.Verify)
	}
	for _, res := range rows {
		if res.Note != "" {
			fmt.Fprintf(&b, "%-22s skipped: %s\n", res.Method, res.Note)
			continue
		}
		if len(res.Samples) == 0 {
			continue
		}
		if res.Method == r.Verify.Method {
			fmt.Fprintf(&b, "%-22s %8.2fs %8.2fs..%8.2fs %7.0f %7.1fs %6d MiB\n", res.Method,
				res.Median().Seconds(), res.Min().Seconds(), res.Max().Seconds(),
				mbps(r.Bytes, res.Median()), res.MedianCPU().Seconds(), res.MaxRSS()>>20)
			continue
		}
		fmt.Fprintf(&b, "%-22s %8.2fs %8.2fs..%8.2fs %7.0f %7.1fs %6d MiB %10s %10s %7.2fs %8.2fs %10s\n", res.Method,
			res.Median().Seconds(), res.Min().Seconds(), res.Max().Seconds(),
			mbps(r.Bytes, res.Median()), res.MedianCPU().Seconds(), res.MaxRSS()>>20,
			ratioText(speedup(res, plain)), ratioText(speedup(res, rclone)),
			res.MedianSync().Seconds(), res.MedianDurable().Seconds(), ratioText(durableSpeedup(res, plain)))
	}
	b.WriteString("vs X = X's median / the method's median (above 1 is faster); CPU = median user+system seconds of the downloading process;\n" +
		"peak RSS = largest over the runs (daemon: VmHWM of the daemon process); +sync = sync(2) right after the run (the daemon fsyncs before\n" +
		"ready, the others leave dirty pages); durable = median of time + sync. Every copy was compared byte for byte with the source after its run.\n")
	if d, ok := r.Result(MethodDaemon); ok && len(d.Samples) > 0 {
		var s3 []string
		for _, s := range d.Samples {
			s3 = append(s3, fmt.Sprint(s.S3Bytes))
		}
		fmt.Fprintf(&b, "daemon warmfleet_s3_bytes_total per run: %s (model: %d bytes)\n", strings.Join(s3, ", "), r.Bytes)
	}
	b.WriteString("commands:\n")
	for _, res := range rows {
		if res.Command != "" {
			fmt.Fprintf(&b, "  %s: %s\n", res.Method, res.Command)
		}
	}
	if rb := r.ReadBack; rb != nil {
		cache := "cold page cache (dropped before every read)"
		if !rb.Cold {
			cache = rb.Note
		}
		fmt.Fprintf(&b, "\nread-back of the daemon's cached files vs a copy written by `%s`: %.2f GiB, %s, %d runs each,\n"+
			"extents (filefrag, all files): cached %d, dd %d\n",
			rb.DDCommand, float64(rb.Bytes)/(1<<30), cache, rb.Runs, rb.CachedExtents, rb.DDExtents)
		fmt.Fprintf(&b, "%-11s %-33s %-33s %9s\n", "reader", "cached: median (range) MB/s", "dd: median (range) MB/s", "cached/dd")
		for _, rr := range rb.Readers {
			fmt.Fprintf(&b, "%-11s %-33s %-33s %8.3fx\n", rr.Reader,
				durationRange(rr.Cached, rb.Bytes), durationRange(rr.DD, rb.Bytes), rr.Ratio())
		}
		b.WriteString("cached/dd = the cached copy's throughput over the dd copy's (medians); goal >= 0.95. Readers:\n")
		for _, rr := range rb.Readers {
			fmt.Fprintf(&b, "  %s: %s\n", rr.Reader, rr.Detail)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// durableSpeedup is speedup on time + sync after.
func durableSpeedup(res, base Result) float64 {
	if len(res.Samples) == 0 || len(base.Samples) == 0 || res.MedianDurable() <= 0 {
		return 0
	}
	return base.MedianDurable().Seconds() / res.MedianDurable().Seconds()
}

func ratioText(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", x)
}

func durationRange(r Result, bytes int64) string {
	return fmt.Sprintf("%.2fs (%.2f..%.2f) %.0f", r.Median().Seconds(), r.Min().Seconds(), r.Max().Seconds(), mbps(bytes, r.Median()))
}

// The JSON form: figures in plain units so scripts need no parsing.
type (
	jsonReport struct {
		Bytes       int64        `json:"bytes"`
		Files       int          `json:"files"`
		Runs        int          `json:"runs"`
		Concurrency int          `json:"concurrency"`
		PartSize    int64        `json:"part_size"`
		CPUs        int          `json:"cpus"`
		LoadStart   string       `json:"load_avg_start"`
		LoadEnd     string       `json:"load_avg_end"`
		Methods     []jsonResult `json:"methods"`
		Verify      *jsonResult  `json:"verify_only,omitempty"`
		VerifyWith  string       `json:"verify_method,omitempty"`
		ReadBack    *jsonReadBk  `json:"read_back,omitempty"`
	}
	jsonResult struct {
		Method        string  `json:"method"`
		Command       string  `json:"command,omitempty"`
		Skipped       string  `json:"skipped,omitempty"`
		MedianSeconds float64 `json:"median_seconds"`
		MinSeconds    float64 `json:"min_seconds"`
		MaxSeconds    float64 `json:"max_seconds"`
		MBps          float64 `json:"mb_per_s"`
		CPUSeconds    float64 `json:"cpu_seconds"`
		PeakRSS       int64   `json:"peak_rss_bytes"`
		VsPlain       float64 `json:"vs_plain,omitempty"`
		VsRclone      float64 `json:"vs_rclone,omitempty"`
		SyncSeconds   float64 `json:"sync_seconds"`
		// Durable figures count the sync after the run.
		DurableSeconds  float64      `json:"durable_median_seconds"`
		DurableVsPlain  float64      `json:"durable_vs_plain,omitempty"`
		DurableVsRclone float64      `json:"durable_vs_rclone,omitempty"`
		Samples         []jsonSample `json:"samples"`
	}
	jsonSample struct {
		Seconds     float64 `json:"seconds"`
		CPUSeconds  float64 `json:"cpu_seconds,omitempty"`
		SyncSeconds float64 `json:"sync_seconds,omitempty"`
		PeakRSS     int64   `json:"peak_rss_bytes,omitempty"`
		S3Bytes     int64   `json:"s3_bytes,omitempty"`
	}
	jsonReadBk struct {
		Bytes     int64        `json:"bytes"`
		Cold      bool         `json:"cold_cache"`
		Note      string       `json:"note,omitempty"`
		DDCommand string       `json:"dd_command"`
		Runs      int          `json:"runs"`
		CachedExt int          `json:"cached_extents"`
		DDExt     int          `json:"dd_extents"`
		Readers   []jsonReader `json:"readers"`
	}
	jsonReader struct {
		Reader string     `json:"reader"`
		Detail string     `json:"detail"`
		Cached jsonTiming `json:"cached"`
		DD     jsonTiming `json:"dd"`
		Ratio  float64    `json:"cached_over_dd"`
	}
	jsonTiming struct {
		MedianSeconds float64   `json:"median_seconds"`
		MinSeconds    float64   `json:"min_seconds"`
		MaxSeconds    float64   `json:"max_seconds"`
		MBps          float64   `json:"mb_per_s"`
		Seconds       []float64 `json:"seconds"`
	}
)

func toTiming(res Result, bytes int64) jsonTiming {
	j := jsonTiming{MedianSeconds: res.Median().Seconds(), MinSeconds: res.Min().Seconds(), MaxSeconds: res.Max().Seconds(),
		MBps: mbps(bytes, res.Median()), Seconds: []float64{}}
	for _, s := range res.Samples {
		j.Seconds = append(j.Seconds, s.Duration.Seconds())
	}
	return j
}

func toJSON(res Result, bytes int64, plain, rclone *Result) jsonResult {
	j := jsonResult{
		Method: res.Method, Command: res.Command, Skipped: res.Note,
		MedianSeconds: res.Median().Seconds(), MinSeconds: res.Min().Seconds(), MaxSeconds: res.Max().Seconds(),
		MBps: mbps(bytes, res.Median()), CPUSeconds: res.MedianCPU().Seconds(), PeakRSS: res.MaxRSS(),
		SyncSeconds: res.MedianSync().Seconds(), DurableSeconds: res.MedianDurable().Seconds(),
		Samples: []jsonSample{},
	}
	if plain != nil {
		j.VsPlain, j.DurableVsPlain = speedup(res, *plain), durableSpeedup(res, *plain)
	}
	if rclone != nil {
		j.VsRclone, j.DurableVsRclone = speedup(res, *rclone), durableSpeedup(res, *rclone)
	}
	for _, s := range res.Samples {
		j.Samples = append(j.Samples, jsonSample{Seconds: s.Duration.Seconds(), CPUSeconds: s.CPU.Seconds(), SyncSeconds: s.Sync.Seconds(), PeakRSS: s.PeakRSS, S3Bytes: s.S3Bytes})
	}
	return j
}

// WriteJSON writes the report as one JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	j := jsonReport{
		Bytes: r.Bytes, Files: r.Files, Runs: r.Config.Runs, Concurrency: r.Config.Concurrency, PartSize: r.Config.PartSize,
		CPUs: r.CPUs, LoadStart: r.LoadStart, LoadEnd: r.LoadEnd, Methods: []jsonResult{}, VerifyWith: r.VerifyMethod,
	}
	var plain, rclone *Result
	if p, ok := r.Result(MethodPlain); ok {
		plain = &p
	}
	if rc, ok := r.Result(MethodRclone); ok {
		rclone = &rc
	}
	for _, res := range r.Results {
		j.Methods = append(j.Methods, toJSON(res, r.Bytes, plain, rclone))
	}
	if len(r.Verify.Samples) > 0 {
		v := toJSON(r.Verify, r.Bytes, nil, nil)
		j.Verify = &v
	}
	if rb := r.ReadBack; rb != nil {
		jr := &jsonReadBk{Bytes: rb.Bytes, Cold: rb.Cold, Note: rb.Note, DDCommand: rb.DDCommand, Runs: rb.Runs,
			CachedExt: rb.CachedExtents, DDExt: rb.DDExtents, Readers: []jsonReader{}}
		for _, rr := range rb.Readers {
			jr.Readers = append(jr.Readers, jsonReader{Reader: rr.Reader, Detail: rr.Detail, Ratio: rr.Ratio(),
				Cached: toTiming(rr.Cached, rb.Bytes), DD: toTiming(rr.DD, rb.Bytes)})
		}
		j.ReadBack = jr
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(j)
}
