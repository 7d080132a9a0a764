package router

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// probeLoop checks every backend each ProbeInterval: a failing probe ejects
// it with backoff, a passing one readmits it, unless requests it failed
// ejected it (then only its backoff readmits it). Until a backend's KV cache size
// is known it also reads the size from its vLLM-style metrics.
func (rt *Router) probeLoop(ctx context.Context) {
	for {
		cfg := rt.Config()
		if cfg.ProbeInterval <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second): // probes may be enabled by a reload
				continue
			}
		}
		rt.ProbeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(cfg.ProbeInterval):
		}
	}
}

// ProbeOnce probes every backend once and waits for the results.
func (rt *Router) ProbeOnce(ctx context.Context) {
	rt.mu.Lock()
	cfg := rt.cfg
	backends := append([]*backend(nil), rt.order...)
	needKV := make([]bool, len(backends))
	for i, b := range backends {
		needKV[i] = b.ep.KVCacheTokens == 0 && b.learnedKV == 0
	}
	rt.mu.Unlock()
	var wg sync.WaitGroup
	for i, b := range backends {
		wg.Go(func() {
			err := rt.probeOne(ctx, b.url+cfg.ProbePath)
			if ctx.Err() != nil {
				return
			}
			kv := 0
			if err == nil && needKV[i] {
				kv = rt.learnKV(ctx, b.url)
			}
			rt.mu.Lock()
			defer rt.mu.Unlock()
			if err != nil {
				if rt.now().After(b.ejectedUntil) {
					b.passive = false
					rt.ejectLocked(b, "probe: "+err.Error())
				}
				return
			}
			switch {
			case !b.passive:
				rt.healthyLocked(b)
			case !rt.now().Before(b.ejectedUntil):
				// Ejected for failing requests: a passing probe proves
				// little (a stalled engine still answers /health), so the
				// backend only gets traffic again once its backoff is over,
				// and the backoff keeps growing until a request succeeds.
				rt.metrics.healthy.WithLabelValues(b.url).Set(1)
			}
			if kv > 0 {
				b.learnedKV = kv
				rt.configureLocked(b)
			}
			rt.wakeLocked()
		})
	}
	wg.Wait()
}

type probeError struct{ status int }

func (e *probeError) Error() string { return "status " + strconv.Itoa(e.status) }

func (rt *Router) probeOne(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := rt.probe.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return &probeError{resp.StatusCode}
	}
	return nil
}

// learnKV reads vllm:cache_config_info from the backend's /metrics and
// returns num_gpu_blocks x block_size tokens, or 0.
func (rt *Router) learnKV(ctx context.Context, base string) int {
	tokens := 0
	rt.readMetrics(ctx, base, func(r io.Reader) { tokens = ParseKVCacheTokens(r) })
	return tokens
}

// maxMetricsBytes bounds what ParseKVCacheTokens reads of a backend's
// metrics page: the parser keeps the whole page's families in memory.
const maxMetricsBytes = 4 << 20

// ParseKVCacheTokens finds vllm:cache_config_info in Prometheus text (read
// with expfmt, at most maxMetricsBytes) and returns num_gpu_blocks x
// block_size of its first sample, or 0 if the page is malformed or the
// metric is absent or implausible.
func ParseKVCacheTokens(r io.Reader) int {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(io.LimitReader(r, maxMetricsBytes))
	if err != nil {
		return 0
	}
	ms := fams["vllm:cache_config_info"].GetMetric()
	if len(ms) == 0 {
		return 0
	}
	blocks, size := 0, 0
	for _, l := range ms[0].GetLabel() {
		n, err := strconv.Atoi(strings.TrimSpace(l.GetValue()))
		if err != nil || n <= 0 || n > 1<<30 {
			continue
		}
		switch l.GetName() {
		case "num_gpu_blocks":
			blocks = n
		case "block_size":
			size = n
		}
	}
	if blocks > 0 && size > 0 && blocks <= (1<<40)/size {
		return blocks * size
	}
	return 0
}
