// Package bench replays LLM workloads through the router against simulated
// backends (router/llmsim) over real HTTP on 127.0.0.1, once per strategy,
// and reports cache hit rate, TTFT, throughput, balance, refusals and the
// router's own overhead.
package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/router/llmsim"
	"github.com/warmfleet/warmfleet/router/oai"
)

// Request is one replayed request.
type Request struct {
	At           time.Duration // simulated offset from the start
	Path         string
	Body         []byte
	PromptTokens int
	OutTokens    int
}

// Workload is a named request list.
type Workload struct {
	Name     string
	Requests []Request
}

// Workload names.
const (
	WorkRAG       = "rag"
	WorkSystem    = "sysprompt"
	WorkMultiTurn = "multiturn"
	WorkNoShare   = "noshare"
	WorkMoonConv  = "mooncake-conversation"
	WorkMoonSynth = "mooncake-synthetic"
	WorkShared    = "shared-prefix"
)

// AllWorkloads lists every workload name in report order.
func AllWorkloads() []string {
	return []string{WorkRAG, WorkSystem, WorkMultiTurn, WorkNoShare, WorkMoonConv, WorkMoonSynth, WorkShared}
}

// text is deterministic filler of n tokens (charsPerToken bytes each):
// lowercase words, different for every rng state.
func text(rng *rand.Rand, tokens, charsPerToken int) string {
	n := tokens * charsPerToken
	b := make([]byte, n)
	for i := range b {
		if rng.IntN(6) == 0 {
			b[i] = ' '
		} else {
			b[i] = byte('a' + rng.IntN(26))
		}
	}
	return string(b)
}

// lines is text broken into lines of lineBytes, as documents and code are:
// each newline is an escape in the JSON body, which the router decodes
// before hashing.
func lines(rng *rand.Rand, tokens, charsPerToken int) string {
	const lineBytes = 70
	b := []byte(text(rng, tokens, charsPerToken))
	for i := lineBytes - 1; i < len(b); i += lineBytes {
		b[i] = '\n'
	}
	return string(b)
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func chatBody(model string, msgs []chatMsg, out int) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": out, "stream": true})
	return b
}

func sessionBody(model, user string, msgs []chatMsg, out int) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "user": user, "messages": msgs, "max_tokens": out, "stream": true})
	return b
}

func completionBody(model, prompt string, out int) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": out, "stream": true})
	return b
}

// zipf draws from 0..n-1 with weight 1/(k+1)^s.
type zipf struct{ cdf []float64 }

func newZipf(n int, s float64) zipf {
	z := zipf{cdf: make([]float64, n)}
	sum := 0.0
	for k := range n {
		sum += 1 / math.Pow(float64(k+1), s)
		z.cdf[k] = sum
	}
	for k := range z.cdf {
		z.cdf[k] /= sum
	}
	return z
}

func (z zipf) draw(rng *rand.Rand) int {
	i, _ := slices.BinarySearch(z.cdf, rng.Float64())
	return min(i, len(z.cdf)-1)
}

// Synthetic builds one of the generated workloads with n requests (arrival
// times are assigned later from the load). kvTokens is one backend's KV
// cache: the RAG corpus is sized to three times that, so no single backend
// can hold it but the fleet can, the regime where routing matters.
func Synthetic(name string, n int, seed uint64, model string, cpt, kvTokens int) (Workload, error) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	w := Workload{Name: name}
	add := func(path string, body []byte, out int) {
		var req oai.Request
		req, _ = oai.Scan(body)
		tok := llmsim.Tokenizer{CharsPerToken: cpt, BlockTokens: 16}.Tokens(llmsim.Render(&req))
		w.Requests = append(w.Requests, Request{Path: path, Body: body, PromptTokens: tok, OutTokens: out})
	}
	switch name {
	case WorkRAG:
		// Retrieval: a short instruction, one of many long documents
		// (Zipf-popular), a unique question.
		const docTokens = 8000
		docs := make([]string, max(8, min(3*kvTokens/docTokens, n/2)))
		for i := range docs {
			docs[i] = text(rng, docTokens, cpt)
		}
		z := newZipf(len(docs), 0.8)
		sys := "Answer using only the document."
		for range n {
			d := z.draw(rng)
			add("/v1/chat/completions", chatBody(model, []chatMsg{{"system", sys}, {"user", docs[d] + "\n\nQuestion: " + text(rng, 40, cpt)}}, 64), 64)
		}
	case WorkSystem:
		// Tens of apps, each with its own system prompt: together small
		// enough for every backend to cache them all.
		prompts := make([]string, 32)
		for i := range prompts {
			prompts[i] = text(rng, 3000, cpt)
		}
		for range n {
			p := rng.IntN(len(prompts))
			add("/v1/chat/completions", chatBody(model, []chatMsg{{"system", prompts[p]}, {"user", text(rng, 300, cpt)}}, 100), 100)
		}
	case WorkMultiTurn:
		// Chat sessions sharing one system prompt (every request starts
		// with the same blocks), each turn resending the whole history.
		sys := text(rng, 400, cpt)
		const turns = 8
		sessions := (n + turns - 1) / turns
		hist := make([][]chatMsg, sessions)
		left := make([]int, sessions)
		for s := range hist {
			hist[s] = []chatMsg{{"system", sys}}
			left[s] = turns
		}
		active := []int{}
		next := 0
		for len(w.Requests) < n {
			// Keep about 12 sessions open at once, interleaved.
			for len(active) < 12 && next < sessions {
				active = append(active, next)
				next++
			}
			if len(active) == 0 {
				break
			}
			i := rng.IntN(len(active))
			s := active[i]
			hist[s] = append(hist[s], chatMsg{"user", text(rng, 150, cpt)})
			// The session names itself as a chat app would, in the user
			// field, for the session strategy.
			add("/v1/chat/completions", sessionBody(model, fmt.Sprintf("session-%d", s), hist[s], 150), 150)
			hist[s] = append(hist[s], chatMsg{"assistant", text(rng, 150, cpt)})
			if left[s]--; left[s] == 0 {
				active = slices.Delete(active, i, i+1)
			}
		}
	case WorkShared:
		// Groups of requests sharing a long prefix, as in llm-d's
		// precise-scheduling benchmark (many shared multi-thousand-token
		// prefixes, each with its own questions), but with prefixes,
		// questions and answers of varied lengths and a skewed
		// popularity. It was written before the self-tuning strategy and
		// none of the router's settings were chosen on it: it stands for
		// traffic nobody tuned for.
		prefixes := make([]string, 40)
		for i := range prefixes {
			prefixes[i] = text(rng, 1500+rng.IntN(4500), cpt)
		}
		z := newZipf(len(prefixes), 1.1)
		for range n {
			p, out := z.draw(rng), 16+rng.IntN(240)
			add("/v1/completions", completionBody(model, prefixes[p]+"\n"+text(rng, 20+rng.IntN(580), cpt), out), out)
		}
	case WorkNoShare:
		for range n {
			add("/v1/completions", completionBody(model, text(rng, 1500, cpt), 100), 100)
		}
	default:
		return w, fmt.Errorf("unknown synthetic workload %q", name)
	}
	return w, nil
}

// TraceRow is one Mooncake trace line.
type TraceRow struct {
	Timestamp    int64    `json:"timestamp"` // ms from the start
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// Mooncake trace facts: one hash id per 512-token block.
const traceBlockTokens = 512

// ParseTrace reads a Mooncake JSONL trace, skipping nothing silently: a bad
// line is an error naming it.
func ParseTrace(r io.Reader, limit int) ([]TraceRow, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	var rows []TraceRow
	line := 0
	for sc.Scan() && (limit <= 0 || len(rows) < limit) {
		line++
		raw := strings.TrimSpace(sc.Text())
		if raw == "" {
			continue
		}
		var row TraceRow
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&row); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if row.Timestamp < 0 || row.InputLength < 1 || row.InputLength > 1<<20 || row.OutputLength < 1 || row.OutputLength > 1<<16 {
			return nil, fmt.Errorf("trace line %d: implausible timestamp or lengths", line)
		}
		if want := (row.InputLength + traceBlockTokens - 1) / traceBlockTokens; len(row.HashIDs) != want {
			return nil, fmt.Errorf("trace line %d: %d hash ids for %d tokens (want %d)", line, len(row.HashIDs), row.InputLength, want)
		}
		if len(rows) > 0 && row.Timestamp < rows[len(rows)-1].Timestamp {
			return nil, fmt.Errorf("trace line %d: timestamps go backwards", line)
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	if len(rows) == 0 {
		return nil, errors.New("trace: no rows")
	}
	return rows, nil
}

// FromTrace expands trace rows into completions requests: every hash id
// becomes a fixed pseudo-random text block derived from the id, so equal
// ids give equal text; the prompt is cut to input_length tokens.
func FromTrace(name string, rows []TraceRow, model string, cpt int) Workload {
	w := Workload{Name: name}
	blocks := map[uint64]string{}
	base := rows[0].Timestamp
	for _, row := range rows {
		var sb strings.Builder
		for _, id := range row.HashIDs {
			t, ok := blocks[id]
			if !ok {
				t = text(rand.New(rand.NewPCG(id, 0x6d6f6f6e)), traceBlockTokens, cpt)
				blocks[id] = t
			}
			sb.WriteString(t)
		}
		prompt := sb.String()[:row.InputLength*cpt]
		w.Requests = append(w.Requests, Request{
			At: time.Duration(row.Timestamp-base) * time.Millisecond, Path: "/v1/completions",
			Body: completionBody(model, prompt, row.OutputLength), PromptTokens: row.InputLength, OutTokens: row.OutputLength,
		})
	}
	return w
}

// LoadTrace reads the named Mooncake workload from dir, or from the copies
// embedded in the binary when dir is empty.
func LoadTrace(dir, name string, offset, n int, model string, cpt int) (Workload, error) {
	file := map[string]string{WorkMoonConv: "mooncake_conversation_trace.jsonl", WorkMoonSynth: "mooncake_synthetic_trace.jsonl"}[name]
	if file == "" {
		return Workload{}, fmt.Errorf("unknown trace workload %q", name)
	}
	f, err := openTrace(dir, file)
	if err != nil {
		return Workload{}, fmt.Errorf("trace %s: %w (--traces-dir empty uses the embedded traces)", name, err)
	}
	defer f.Close()
	rows, err := ParseTrace(f, offset+n)
	if err != nil {
		return Workload{}, fmt.Errorf("%s: %w", file, err)
	}
	if offset < 0 || offset >= len(rows) {
		return Workload{}, fmt.Errorf("%s: offset %d beyond %d rows", file, offset, len(rows))
	}
	return FromTrace(name, rows[offset:], model, cpt), nil
}

// Schedule sets arrival times so the offered prefill work (every prompt
// token computed, nothing cached) is load x the fleet's prefill capacity.
// Trace workloads keep their relative timing (burstiness), scaled;
// synthetic ones get Poisson arrivals.
func (w *Workload) Schedule(load float64, backends int, prefillPerToken time.Duration, seed uint64) {
	if len(w.Requests) == 0 {
		return
	}
	total := 0
	for _, r := range w.Requests {
		total += r.PromptTokens
	}
	meanService := float64(total) / float64(len(w.Requests)) * prefillPerToken.Seconds()
	w.ScheduleRate(load*float64(backends)/meanService, seed) // requests per simulated second
}

// ScheduleRate sets arrival times at rate requests per second on average:
// a trace's timing scaled to that mean rate, Poisson arrivals otherwise.
func (w *Workload) ScheduleRate(rate float64, seed uint64) {
	if len(w.Requests) == 0 {
		return
	}
	span := float64(len(w.Requests)) / rate
	last := w.Requests[len(w.Requests)-1].At
	if last > 0 {
		k := span / last.Seconds()
		for i := range w.Requests {
			w.Requests[i].At = time.Duration(float64(w.Requests[i].At) * k)
		}
		return
	}
	rng := rand.New(rand.NewPCG(seed, 0xa771))
	t := 0.0
	for i := range w.Requests {
		w.Requests[i].At = time.Duration(t * float64(time.Second))
		t += rng.ExpFloat64() / rate
	}
}

// BestReuse is the fraction of prompt tokens a cache could serve: blocks
// seen before (as the simulator hashes them). capacity 0 means unlimited;
// otherwise one LRU of that many blocks (the whole fleet's KV as one cache).
func BestReuse(w *Workload, tok llmsim.Tokenizer, capacity int) float64 {
	seen := map[uint64]int{} // hash -> last use
	type use struct {
		h    uint64
		tick int
	}
	var order []use // append-only LRU log, compacted lazily
	tick, hit, total := 0, 0, 0
	for _, r := range w.Requests {
		req, err := oai.Scan(r.Body)
		if err != nil {
			continue
		}
		// The seed does not change which blocks repeat.
		hashes, tokens := promptBlocks(&req, tok, "")
		lead := 0
		for lead < len(hashes) {
			if _, ok := seen[hashes[lead]]; !ok {
				break
			}
			lead++
		}
		hit += max(0, min(lead*tok.BlockTokens, tokens-1))
		total += tokens
		for i := len(hashes) - 1; i >= 0; i-- {
			tick++
			seen[hashes[i]] = tick
			order = append(order, use{hashes[i], tick})
		}
		if capacity > 0 {
			for len(seen) > capacity {
				u := order[0]
				order = order[1:]
				if seen[u.h] == u.tick {
					delete(seen, u.h)
				}
			}
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}
