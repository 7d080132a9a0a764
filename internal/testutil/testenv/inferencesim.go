package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// InferenceSimVersion is the llm-d-inference-sim the Makefile installs.
const InferenceSimVersion = "v0.10.2"

// InferenceSim is a running llm-d-inference-sim: an OpenAI-compatible
// engine simulator with vLLM's prefix cache bookkeeping that publishes
// vLLM-format KV-cache events over ZMQ.
type InferenceSim struct {
	URL   string // http://127.0.0.1:PORT
	Model string
	stop  func()
}

// InferenceSimOptions configure StartInferenceSim.
type InferenceSimOptions struct {
	Model string
	// EventsEndpoint is where the simulator sends its KV events
	// (tcp://HOST:PORT). The simulator connects to it, so the subscriber
	// listens there.
	EventsEndpoint string
	BlockSize      int // tokens per block (8, 16, 32, 64 or 128)
	CacheBlocks    int // blocks in the simulated KV cache
	HashSeed       string
	// MaxModelLen is the longest prompt plus output it takes, in tokens
	// (0: the simulator's default, 1024).
	MaxModelLen int
	// MapEvents selects vLLM's map encoding of events (named fields)
	// instead of the array encoding.
	MapEvents bool
	// Random answers with filler text as long as max_tokens allows (all of
	// it with ignore_eos) instead of echoing the prompt: an echo is as long
	// as the prompt's last message whatever max_tokens says, so a benchmark
	// that sizes its load by output length needs this.
	Random bool
	// The simulator's latency model (zero: its defaults, which answer at
	// once whatever the prompt): a request's time to first token is
	// (PrefillOverhead + uncached prompt tokens x PrefillPerToken) x the
	// load factor, which grows linearly from 1 with one sequence running
	// to LoadFactor with MaxNumSeqs running; each output token takes
	// InterTokenLatency x the load factor. Requests beyond MaxNumSeqs wait.
	PrefillOverhead, PrefillPerToken, InterTokenLatency time.Duration
	MaxNumSeqs                                          int
	LoadFactor                                          float64
}

// InferenceSimPath finds the simulator in the repository's bin/ or PATH.
func InferenceSimPath() (string, error) {
	return ToolPath("llm-d-inference-sim", "go install github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim@"+InferenceSimVersion)
}

// StartInferenceSim starts the simulator on a free loopback port with its
// KV cache and event publishing on, and stops it when the test ends (or
// earlier, by Stop).
func StartInferenceSim(tb testing.TB, o InferenceSimOptions) *InferenceSim {
	tb.Helper()
	bin := Bin(tb, "llm-d-inference-sim")
	return startForTest(tb, "llm-d-inference-sim", 60*time.Second, func(ctx context.Context) (*InferenceSim, func() error, error) {
		s, err := launchInferenceSim(ctx, bin, o)
		if err != nil {
			return nil, nil, err
		}
		return s, func() error { s.Stop(); return nil }, nil
	})
}

// LaunchInferenceSim starts the simulator outside a test (the lab's
// benchmarks); the caller stops it.
func LaunchInferenceSim(ctx context.Context, o InferenceSimOptions) (*InferenceSim, error) {
	bin, err := InferenceSimPath()
	if err != nil {
		return nil, err
	}
	return launchInferenceSim(ctx, bin, o)
}

func launchInferenceSim(ctx context.Context, bin string, o InferenceSimOptions) (*InferenceSim, error) {
	var lastErr error
	// A port picked by us may be taken before the simulator binds it.
	for range 3 {
		s, err := startInferenceSim(ctx, bin, o)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func startInferenceSim(ctx context.Context, bin string, o InferenceSimOptions) (*InferenceSim, error) {
	addr, err := PickFreeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	mode := "echo"
	if o.Random {
		mode = "random"
	}
	args := []string{
		"--port", port,
		"--model", o.Model,
		"--mode", mode,
		"--enable-kvcache",
		"--kv-cache-size", strconv.Itoa(o.CacheBlocks),
		"--block-size", strconv.Itoa(o.BlockSize),
		"--zmq-endpoint", o.EventsEndpoint,
		"--hash-seed", o.HashSeed,
		"--event-batch-size", "16",
		"--force-dummy-tokenizer",
		"--use-vllm-map-event-format=" + strconv.FormatBool(o.MapEvents),
	}
	if o.MaxModelLen > 0 {
		args = append(args, "--max-model-len", strconv.Itoa(o.MaxModelLen))
	}
	for flag, d := range map[string]time.Duration{"--prefill-overhead": o.PrefillOverhead, "--prefill-time-per-token": o.PrefillPerToken,
		"--inter-token-latency": o.InterTokenLatency} {
		if d > 0 {
			args = append(args, flag, d.String())
		}
	}
	if o.MaxNumSeqs > 0 {
		args = append(args, "--max-num-seqs", strconv.Itoa(o.MaxNumSeqs))
	}
	if o.LoadFactor > 1 {
		args = append(args, "--time-factor-under-load", strconv.FormatFloat(o.LoadFactor, 'g', -1, 64))
	}
	cmd := exec.Command(bin, args...)
	// The simulator names its event topic after POD_IP and refuses to
	// publish without it; only --hash-seed may seed its block hashes.
	cmd.Env = append(filteredEnv(os.Environ(), "POD_IP", "PYTHONHASHSEED"), "POD_IP=127.0.0.1")
	svc, err := startService(cmd, 16<<10)
	if err != nil {
		return nil, err
	}
	s := &InferenceSim{URL: "http://" + addr, Model: o.Model, stop: func() { svc.stop(2 * time.Second) }}
	if err := WaitHTTP(ctx, nil, s.URL+"/v1/models", svc.exited); err != nil {
		return nil, svc.startFailed(fmt.Sprintf("llm-d-inference-sim on %s", addr), err)
	}
	return s, nil
}

// Stop stops the simulator (idempotent).
func (s *InferenceSim) Stop() { s.stop() }
