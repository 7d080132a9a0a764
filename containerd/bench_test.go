package imagecache

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/testimage"
)

// BenchmarkPrePull compares Ensure with `ctr images pull` of the same image
// against the same containerd and registry, alternating which goes first.
// Between runs the image is deleted and garbage collected, so every run
// fetches and unpacks everything. Size and layers come from
// WARMFLEET_BENCH_IMAGE_MIB (default 512) and WARMFLEET_BENCH_LAYERS
// (default 8). Run with -benchtime=3x for three measured rounds; the
// medians are reported as metrics and every run is logged.
//
//	go test -run '^$' -bench PrePull -benchtime 3x ./containerd/
func BenchmarkPrePull(b *testing.B) {
	mib := envInt(b, "WARMFLEET_BENCH_IMAGE_MIB", 512)
	layers := envInt(b, "WARMFLEET_BENCH_LAYERS", 8)
	ctr := testenv.Bin(b, "ctr")
	ctd := testenv.StartContainerd(b)
	reg := testenv.StartRegistry(b)
	ref := reg.Ref("warmfleet/bench", "v1")
	if _, err := testimage.BuildAndPush(context.Background(), ref, testimage.Spec{Layers: layers, Size: int64(mib) << 20, Seed: 42}, testimage.Auth{}); err != nil {
		b.Fatal(err)
	}
	c, err := client.New(ctd.Address)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	hosts := b.TempDir()
	if err := os.MkdirAll(hosts+"/"+reg.Addr, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(hosts+"/"+reg.Addr+"/hosts.toml", fmt.Appendf(nil, "server = %q\n", "http://"+reg.Addr), 0o644); err != nil {
		b.Fatal(err)
	}
	cache, err := New(c, Options{Namespace: testNS, Snapshotter: ctd.Snapshotter, HostsDir: hosts, DisableECR: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := cache.scope(context.Background())
	clean := func() {
		if err := c.ImageService().Delete(ctx, ref, images.SynchronousDelete()); err != nil {
			b.Fatalf("delete: %v", err)
		}
		infos := 0
		if err := c.ContentStore().Walk(ctx, func(content.Info) error { infos++; return nil }); err != nil {
			b.Fatal(err)
		}
		if infos != 0 {
			b.Fatalf("%d blobs left in the content store after delete", infos)
		}
	}

	var ens, base []pullRun
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runCtr := func() {
			cpu0 := procCPU(b, ctd.PID)
			start := time.Now()
			cmd := exec.Command(ctr, "-a", ctd.Address, "-n", testNS, "images", "pull", "--plain-http", "--snapshotter", ctd.Snapshotter, ref)
			out, err := cmd.CombinedOutput()
			if err != nil {
				b.Fatalf("ctr pull: %v\n%s", err, out)
			}
			ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			base = append(base, pullRun{
				wall:    time.Since(start),
				cpu:     tv(ru.Utime) + tv(ru.Stime),
				rss:     ru.Maxrss << 10,
				daemonC: procCPU(b, ctd.PID) - cpu0,
			})
			clean()
		}
		runEnsure := func() {
			cpu0 := procCPU(b, ctd.PID)
			var ru0, ru1 syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			stop := sampleRSS()
			start := time.Now()
			st, err := cache.Ensure(context.Background(), ref, "bench")
			wall := time.Since(start)
			peak, before := stop()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			if err != nil || st.State != StateReady || !st.Unpacked {
				b.Fatalf("Ensure: %+v, %v", st, err)
			}
			ens = append(ens, pullRun{
				wall:    wall,
				cpu:     tv(ru1.Utime) + tv(ru1.Stime) - tv(ru0.Utime) - tv(ru0.Stime),
				rss:     peak,
				rss0:    before,
				daemonC: procCPU(b, ctd.PID) - cpu0,
			})
			clean()
		}
		if i%2 == 0 {
			runCtr()
			runEnsure()
		} else {
			runEnsure()
			runCtr()
		}
	}
	b.StopTimer()
	for i := range ens {
		b.Logf("run %d: Ensure %v (cpu %v, rss peak %.1f MiB from %.1f, containerd cpu %v) | ctr %v (cpu %v, maxrss %.1f MiB, containerd cpu %v)",
			i, ens[i].wall.Round(time.Millisecond), ens[i].cpu.Round(time.Millisecond), mibf(ens[i].rss), mibf(ens[i].rss0), ens[i].daemonC.Round(time.Millisecond),
			base[i].wall.Round(time.Millisecond), base[i].cpu.Round(time.Millisecond), mibf(base[i].rss), base[i].daemonC.Round(time.Millisecond))
	}
	me, mb := median(ens, func(r pullRun) float64 { return r.wall.Seconds() }), median(base, func(r pullRun) float64 { return r.wall.Seconds() })
	b.ReportMetric(me, "ensure-s")
	b.ReportMetric(mb, "ctr-s")
	b.ReportMetric(me/mb, "ratio")
	b.ReportMetric(median(ens, func(r pullRun) float64 { return r.cpu.Seconds() }), "ensure-cpu-s")
	b.ReportMetric(median(base, func(r pullRun) float64 { return r.cpu.Seconds() }), "ctr-cpu-s")
	b.ReportMetric(median(ens, func(r pullRun) float64 { return mibf(r.rss) }), "ensure-rss-MiB")
	b.ReportMetric(median(base, func(r pullRun) float64 { return mibf(r.rss) }), "ctr-maxrss-MiB")
	b.ReportMetric(float64(mib)*float64(1<<20)/me/1e6, "ensure-MB/s")
}

type pullRun struct {
	wall, cpu, daemonC time.Duration
	rss, rss0          int64
}

func median(runs []pullRun, f func(pullRun) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

func tv(t syscall.Timeval) time.Duration {
	return time.Duration(t.Sec)*time.Second + time.Duration(t.Usec)*time.Microsecond
}

func mibf(b int64) float64 { return float64(b) / (1 << 20) }

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// procCPU returns a process's user+system CPU time from /proc (clock
// ticks are 100 Hz on Linux).
func procCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which may contain spaces.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// sampleRSS samples this process's resident set every 10 ms until the
// returned stop is called, which gives the peak and the first sample.
func sampleRSS() (stop func() (peak, before int64)) {
	var mu sync.Mutex
	first := readRSS()
	peak := first
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				r := readRSS()
				mu.Lock()
				peak = max(peak, r)
				mu.Unlock()
			}
		}
	}()
	return func() (int64, int64) {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return max(peak, readRSS()), first
	}
}

func readRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
