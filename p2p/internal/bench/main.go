// Command bench measures the p2p data plane against a plain Go HTTP copy of
// the same bytes on loopback, in the same run: throughput ratio, receiver
// CPU seconds per GiB and receiver peak RSS (VmHWM).
//
//	go run ./p2p/internal/bench -size 1GiB -piece 8MiB -runs 3
//
// It re-executes itself as a seed process (serving the file over p2p and
// HTTP) and as one receiver process per measurement, so RSS and CPU are the
// receiver's alone. Before each measurement the previous output is deleted
// and it pauses (the VM's memory balloon makes writes into freshly freed
// page cache slower at times).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/p2p"
	bolt "go.etcd.io/bbolt"
)

var key = []byte("warmfleet-bench-cluster-key-32b!")

type result struct {
	Bytes      int64   `json:"bytes"`
	Seconds    float64 `json:"seconds"`     // until every byte is written (verified for p2p)
	SyncedSecs float64 `json:"synced_secs"` // until durable (fdatasync)
	CPU        float64 `json:"cpu"`         // user+sys seconds until Seconds
	HWMKiB     int64   `json:"hwm_kib"`
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "seed":
			exit(seed(os.Args[2:]))
		case "http":
			exit(httpGet(os.Args[2:]))
		case "leech":
			exit(leech(os.Args[2:]))
		}
	}
	exit(orchestrate())
}

func exit(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func orchestrate() error {
	sizeS := flag.String("size", "1GiB", "bytes to move")
	pieceS := flag.String("piece", "8MiB", "piece length")
	runs := flag.Int("runs", 3, "measurements per mode")
	dir := flag.String("dir", "/var/tmp/wfbench", "work directory")
	algo := flag.String("algo", "blake3", "piece hash: sha1, sha256 or blake3")
	tlsOn := flag.Bool("tls", false, "also measure TLS 1.3 (encrypted) connections")
	pause := flag.Duration("pause", time.Second, "pause after deleting output")
	syncEvery := flag.Duration("sync", 0, "receiver's FetchOptions.SyncInterval (0: the default)")
	flag.Parse()
	size, err := bytesize.Parse(*sizeS)
	if err != nil {
		return err
	}
	piece, err := bytesize.Parse(*pieceS)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	src := filepath.Join(*dir, "src")
	if err := ensureSource(src, size); err != nil {
		return err
	}
	ha, err := p2p.ParseHashAlgo(*algo)
	if err != nil {
		return err
	}
	m, err := hashManifest(src, size, piece, ha)
	if err != nil {
		return err
	}
	mpath := filepath.Join(*dir, "manifest")
	enc, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	if err := os.WriteFile(mpath, enc, 0o644); err != nil {
		return err
	}
	modes := []string{"http", "p2p"}
	if *tlsOn {
		modes = append(modes, "p2p-tls")
	}
	seeds := map[bool]*seedProc{}
	for _, enc := range []bool{false, true} {
		if enc && !*tlsOn {
			continue
		}
		sp, err := startSeed(*dir, mpath, enc)
		if err != nil {
			return err
		}
		defer sp.stop()
		seeds[enc] = sp
	}
	fmt.Printf("size=%d piece=%d algo=%s runs=%d sync=%v\n", size, piece, *algo, *runs, *syncEvery)
	all := map[string][]result{}
	out := filepath.Join(*dir, "out")
	for r := range *runs {
		order := slices.Clone(modes)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, mode := range order {
			_ = os.Remove(out)
			_ = os.Remove(out + ".db")
			time.Sleep(*pause)
			var args []string
			switch mode {
			case "http":
				args = []string{"http", "-url", "http://" + seeds[false].httpAddr + "/src", "-out", out}
			case "p2p":
				args = []string{"leech", "-sync", syncEvery.String(), "-peer", seeds[false].p2pAddr, "-manifest", mpath, "-out", out}
			case "p2p-tls":
				args = []string{"leech", "-sync", syncEvery.String(), "-tls", "-peer", seeds[true].p2pAddr, "-manifest", mpath, "-out", out}
			}
			res, err := child(args...)
			if err != nil {
				return fmt.Errorf("%s run %d: %w", mode, r, err)
			}
			if res.Bytes != size {
				return fmt.Errorf("%s run %d moved %d bytes, want %d", mode, r, res.Bytes, size)
			}
			all[mode] = append(all[mode], res)
			fmt.Printf("run %d %-8s %7.1f MB/s  written %.2fs  durable %.2fs  cpu %.2fs (%.2f s/GiB)  hwm %d MiB\n",
				r, mode, float64(size)/res.Seconds/1e6, res.Seconds, res.SyncedSecs, res.CPU, res.CPU/(float64(size)/(1<<30)), res.HWMKiB>>10)
		}
		if err := verifyOut(src, out, size); err != nil {
			return err
		}
	}
	fmt.Println("---- medians [min..max]")
	for _, mode := range modes {
		rs := all[mode]
		tp := collect(rs, func(x result) float64 { return float64(size) / x.Seconds / 1e6 })
		cpu := collect(rs, func(x result) float64 { return x.CPU / (float64(size) / (1 << 30)) })
		hwm := collect(rs, func(x result) float64 { return float64(x.HWMKiB) / 1024 })
		dur := collect(rs, func(x result) float64 { return float64(size) / x.SyncedSecs / 1e6 })
		fmt.Printf("%-8s throughput %s MB/s  durable %s MB/s  cpu %s s/GiB  hwm %s MiB\n", mode, stat(tp), stat(dur), stat(cpu), stat(hwm))
		if mode != "http" {
			// Ratio per run against the HTTP copy of the same run.
			var ratio, ratioDur []float64
			for i := range rs {
				ratio = append(ratio, all["http"][i].Seconds/rs[i].Seconds)
				ratioDur = append(ratioDur, all["http"][i].SyncedSecs/rs[i].SyncedSecs)
			}
			fmt.Printf("%-8s ratio vs http copy: written %s  durable %s\n", mode, stat(ratio), stat(ratioDur))
		}
	}
	return nil
}

func collect(rs []result, f func(result) float64) []float64 {
	var out []float64
	for _, r := range rs {
		out = append(out, f(r))
	}
	return out
}

func stat(v []float64) string {
	s := slices.Clone(v)
	slices.Sort(s)
	return fmt.Sprintf("%.2f [%.2f..%.2f]", s[len(s)/2], s[0], s[len(s)-1])
}

func ensureSource(path string, size int64) error {
	if st, err := os.Stat(path); err == nil && st.Size() == size {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 4<<20)
	_, err = io.CopyN(w, rand.NewChaCha8([32]byte{1}), size)
	if err != nil {
		return err
	}
	return w.Flush()
}

func hashManifest(path string, size, piece int64, algo p2p.HashAlgo) (*p2p.Manifest, error) {
	// Build does exactly what an origin does; run it into a scratch node
	// with the source file itself as the byte source and target.
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := p2p.NewNode(p2p.Config{NodeID: "hasher", ClusterKey: key})
	if err != nil {
		return nil, err
	}
	db, err := bolt.Open(path+".hash.db", 0o600, nil)
	if err != nil {
		return nil, err
	}
	defer func() { db.Close(); os.Remove(path + ".hash.db") }()
	comp, err := p2p.NewBoltCompletion(db, "c")
	if err != nil {
		return nil, err
	}
	src := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		return io.NopCloser(io.NewSectionReader(f, off, n)), nil
	}
	s, err := n.Build(context.Background(), p2p.BuildSpec{ShardID: "bench", Name: "src", Path: path,
		FileSize: size, Length: size, PieceLength: piece, Algo: algo, Source: src, Completion: comp})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Manifest(), nil
}

func verifyOut(src, out string, size int64) error {
	a, err := os.Open(src)
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := os.Open(out)
	if err != nil {
		return err
	}
	defer b.Close()
	ba, bb := make([]byte, 4<<20), make([]byte, 4<<20)
	for off := int64(0); off < size; off += int64(len(ba)) {
		na, _ := a.ReadAt(ba, off)
		nb, _ := b.ReadAt(bb, off)
		if na != nb || string(ba[:na]) != string(bb[:nb]) {
			return fmt.Errorf("output differs from source near offset %d", off)
		}
	}
	return nil
}

type seedProc struct {
	cmd               *exec.Cmd
	p2pAddr, httpAddr string
}

func startSeed(dir, mpath string, encrypt bool) (*seedProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"seed", "-dir", dir, "-manifest", mpath}
	if encrypt {
		args = append(args, "-tls")
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill() // best effort: the error below is the one to report
		return nil, fmt.Errorf("seed: %w", err)
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "READY" {
		_ = cmd.Process.Kill() // best effort: the error below is the one to report
		return nil, fmt.Errorf("seed said %q", line)
	}
	return &seedProc{cmd: cmd, p2pAddr: f[1], httpAddr: f[2]}, nil
}

func (s *seedProc) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
}

func child(args ...string) (result, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return result{}, err
	}
	var r result
	return r, json.Unmarshal(b, &r)
}

func readManifest(path string) (*p2p.Manifest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return p2p.DecodeManifest(b)
}

// seed serves the source file over p2p and over plain HTTP (net/http
// sends files with sendfile too) until killed.
func seed(args []string) error {
	fs := flag.NewFlagSet("seed", flag.ExitOnError)
	dir := fs.String("dir", "", "")
	mpath := fs.String("manifest", "", "")
	encrypt := fs.Bool("tls", false, "")
	_ = fs.Parse(args)
	m, err := readManifest(*mpath)
	if err != nil {
		return err
	}
	n, err := p2p.NewNode(p2p.Config{NodeID: "seed", ClusterKey: key, Encrypt: *encrypt,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	dbPath := filepath.Join(*dir, fmt.Sprintf("seed-%v.db", *encrypt))
	db, err := bolt.Open(dbPath, 0o600, nil)
	if err != nil {
		return err
	}
	comp, err := p2p.NewBoltCompletion(db, "c")
	if err != nil {
		return err
	}
	src := filepath.Join(*dir, "src")
	s, err := n.Open(context.Background(), m, src, comp)
	if err != nil {
		return err
	}
	if _, err := s.Recheck(context.Background()); err != nil {
		return err
	}
	if !s.Complete() {
		return errors.New("seed: source does not match the manifest")
	}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() {
		_ = http.Serve(hl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.ServeFile(w, r, src)
		}))
	}()
	fmt.Printf("READY %s %s\n", pl.Addr(), hl.Addr())
	return n.Serve(context.Background(), pl)
}

func usage() (cpu float64) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func hwmKiB() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}

func report(r result) error {
	r.HWMKiB = hwmKiB()
	return json.NewEncoder(os.Stdout).Encode(r)
}

// httpGet is the baseline: net/http GET and io.Copy into a new file.
func httpGet(args []string) error {
	fs := flag.NewFlagSet("http", flag.ExitOnError)
	url := fs.String("url", "", "")
	out := fs.String("out", "", "")
	_ = fs.Parse(args)
	cpu0, t0 := usage(), time.Now()
	resp, err := http.Get(*url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(f, resp.Body)
	if err != nil {
		return err
	}
	r := result{Bytes: n, Seconds: time.Since(t0).Seconds(), CPU: usage() - cpu0}
	if err := f.Sync(); err != nil {
		return err
	}
	r.SyncedSecs = time.Since(t0).Seconds()
	return report(r)
}

// leech fetches the shard from the seed with a fresh completion store.
func leech(args []string) error {
	fs := flag.NewFlagSet("leech", flag.ExitOnError)
	peer := fs.String("peer", "", "")
	mpath := fs.String("manifest", "", "")
	out := fs.String("out", "", "")
	encrypt := fs.Bool("tls", false, "")
	syncEvery := fs.Duration("sync", 0, "")
	_ = fs.Parse(args)
	m, err := readManifest(*mpath)
	if err != nil {
		return err
	}
	// Each leech process has a fresh identity key, so it needs a name of
	// its own: the seed pins a name to the first key it sees.
	n, err := p2p.NewNode(p2p.Config{NodeID: fmt.Sprintf("leech-%d", os.Getpid()), ClusterKey: key, Encrypt: *encrypt,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	db, err := bolt.Open(*out+".db", 0o600, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	comp, err := p2p.NewBoltCompletion(db, "c")
	if err != nil {
		return err
	}
	s, err := n.Open(context.Background(), m, *out, comp)
	if err != nil {
		return err
	}
	if p := os.Getenv("WFBENCH_CPUPROFILE"); p != "" {
		pf, err := os.Create(p)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	cpu0, t0 := usage(), time.Now()
	var r result
	var wg sync.WaitGroup
	wg.Go(func() {
		for !s.Complete() {
			time.Sleep(2 * time.Millisecond)
		}
		r.Seconds, r.CPU = time.Since(t0).Seconds(), usage()-cpu0
	})
	res, err := s.Fetch(context.Background(), p2p.FetchOptions{SyncInterval: *syncEvery,
		Peers: p2p.PeerFunc(func() []string { return []string{*peer} })})
	if err != nil {
		return err
	}
	r.SyncedSecs = time.Since(t0).Seconds()
	wg.Wait()
	if res.PeerBytes != m.Length || n.Stats().PiecesVerified != int64(m.NumPieces()) {
		return errors.New("not every piece came from the peer and was verified")
	}
	r.Bytes = res.PeerBytes
	return report(r)
}
