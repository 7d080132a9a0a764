package oai

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestScan(t *testing.T) {
	cases := []struct {
		name string
		body string
		want Request
		err  string // "syntax", "field" or ""
	}{
		{name: "chat", body: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"stream":true,"max_tokens":7}`,
			want: Request{Model: "m", HasMessages: true, Messages: []Message{{"system", []byte("be brief")}, {"user", []byte("hi")}}, Stream: true, MaxTokens: 7}},
		{name: "completions escaped", body: ` {"prompt":"a\nb\u00e9","model":"x","cache_salt":"s1","user":"u"} `,
			want: Request{Model: "x", HasPrompt: true, Prompt: []byte("a\nbé"), CacheSalt: "s1", User: "u", MaxTokens: -1}},
		{name: "token prompt raw", body: `{"model":"x","prompt":[1, 2,3]}`,
			want: Request{Model: "x", HasPrompt: true, Prompt: []byte("[1, 2,3]"), Tokens: []uint32{1, 2, 3}, MaxTokens: -1}},
		{name: "string array prompt raw", body: `{"prompt":["a","b"]}`, want: Request{HasPrompt: true, Prompt: []byte(`["a","b"]`), MaxTokens: -1}},
		{name: "token arrays prompt raw", body: `{"prompt":[[1,2],[3]]}`, want: Request{HasPrompt: true, Prompt: []byte(`[[1,2],[3]]`), MaxTokens: -1}},
		{name: "empty array prompt", body: `{"prompt":[]}`, want: Request{HasPrompt: true, Prompt: []byte(`[]`), MaxTokens: -1}},
		{name: "mixed prompt", body: `{"prompt":["a",1]}`, err: "field"},
		{name: "object in prompt", body: `{"prompt":[{"x":null}]}`, err: "field"},
		{name: "fractional token", body: `{"prompt":[1.5]}`, err: "field"},
		{name: "negative token", body: `{"prompt":[-1]}`, err: "field"},
		{name: "string in token array", body: `{"prompt":[[1,"a"]]}`, err: "field"},
		{name: "null in prompt", body: `{"prompt":[null]}`, err: "field"},
		{name: "mixed prompt, then bad syntax", body: `{"prompt":["a",1],"x":tru}`, err: "syntax"},
		{name: "parts content raw", body: `{"model":"x","messages":[{"content":[{"type":"text","text":"hi"}],"role":"user","name":"n"}]}`,
			want: Request{Model: "x", HasMessages: true, Messages: []Message{{"user", []byte(`[{"type":"text","text":"hi"}]`)}}, MaxTokens: -1}},
		{name: "max_completion_tokens wins", body: `{"max_completion_tokens":3,"max_tokens":9}`, want: Request{MaxTokens: 3}},
		{name: "duplicate key last wins", body: `{"model":"a","model":"b"}`, want: Request{Model: "b", MaxTokens: -1}},
		{name: "escaped key", body: `{"mod\u0065l":"a"}`, want: Request{Model: "a", MaxTokens: -1}},
		{name: "unknown fields skipped", body: `{"x":{"y":[1,-2.5e+3,true,false,null,"\"",{}]},"model":"m"}`, want: Request{Model: "m", MaxTokens: -1}},
		{name: "null stream and user", body: `{"stream":null,"user":null,"max_tokens":null}`, want: Request{MaxTokens: -1}},
		{name: "empty", body: ``, err: "syntax"},
		{name: "truncated", body: `{"model":"m","messages":[{"role":"u`, err: "syntax"},
		{name: "trailing", body: `{"model":"m"} x`, err: "syntax"},
		{name: "bad number", body: `{"a":01}`, err: "syntax"},
		{name: "bad escape", body: `{"a":"\x"}`, err: "syntax"},
		{name: "control char", body: "{\"a\":\"\x01\"}", err: "syntax"},
		{name: "array body", body: `[1]`, err: "field"},
		{name: "model number", body: `{"model":5}`, err: "field"},
		{name: "messages object", body: `{"messages":{}}`, err: "field"},
		{name: "message not object", body: `{"messages":["hi"]}`, err: "field"},
		{name: "prompt number", body: `{"prompt":5}`, err: "field"},
		{name: "negative max_tokens", body: `{"max_tokens":-1}`, err: "field"},
		{name: "fractional max_tokens", body: `{"max_tokens":1.5}`, err: "field"},
		{name: "stream string", body: `{"stream":"yes"}`, err: "field"},
		{name: "deep nesting", body: `{"a":` + strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1) + `}`, err: "syntax"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Scan([]byte(tc.body))
			var fe *FieldError
			switch tc.err {
			case "syntax":
				if !IsSyntax(err) {
					t.Fatalf("err = %v, want syntax error", err)
				}
				return
			case "field":
				if !errors.As(err, &fe) {
					t.Fatalf("err = %v, want field error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Scan: %v", err)
			}
			if !equalRequest(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func equalRequest(a, b Request) bool {
	if a.Model != b.Model || !bytes.Equal(a.Prompt, b.Prompt) || a.HasPrompt != b.HasPrompt || a.HasMessages != b.HasMessages ||
		a.CacheSalt != b.CacheSalt || a.User != b.User || a.Stream != b.Stream || a.MaxTokens != b.MaxTokens || len(a.Messages) != len(b.Messages) ||
		!slices.Equal(a.Tokens, b.Tokens) || (a.Tokens == nil) != (b.Tokens == nil) {
		return false
	}
	for i := range a.Messages {
		if a.Messages[i].Role != b.Messages[i].Role || !bytes.Equal(a.Messages[i].Content, b.Messages[i].Content) {
			return false
		}
	}
	return true
}

// FuzzScan checks the scanner against encoding/json: it accepts exactly the
// objects json.Valid accepts (unless a routing field has the wrong type) and
// extracts the same values.
func FuzzScan(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.json")
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"model":"m","prompt":"x\u12"}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":null}],"stream":false}`))
	f.Add([]byte(`{"model":"m","prompt":[1, 20 ,0,4294967295]}`))
	f.Add([]byte(`{"prompt":[4294967296],"prompt":[01]}`))
	f.Add([]byte(`{"prompt":[12345,1234567,12345678,0,01,7,99],"model":"m"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := Scan(body)
		valid := json.Valid(body)
		if IsSyntax(err) {
			if valid {
				t.Fatalf("syntax error %v on valid JSON %q", err, body)
			}
			return
		}
		if !valid {
			t.Fatalf("accepted invalid JSON %q (err %v)", body, err)
		}
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) != nil {
			if err == nil {
				t.Fatalf("accepted non-object %q", body)
			}
			return
		}
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("unexpected error kind %v", err)
			}
			return
		}
		checkString(t, top["model"], got.Model)
		checkString(t, top["cache_salt"], got.CacheSalt)
		if raw, ok := top["prompt"]; ok != got.HasPrompt {
			t.Fatalf("HasPrompt=%v, present=%v", got.HasPrompt, ok)
		} else if ok {
			checkText(t, raw, got.Prompt)
		}
		// Tokens are what TokenIDs reads from the prompt, when that is a
		// non-empty list of ids.
		want, ok := TokenIDs(got.Prompt, nil)
		if !ok || len(want) == 0 || !got.HasPrompt || got.Prompt[0] != '[' {
			want = nil
		}
		if !slices.Equal(got.Tokens, want) || (got.Tokens == nil) != (want == nil) {
			t.Fatalf("Tokens %v, want %v (prompt %q)", got.Tokens, want, got.Prompt)
		}
		if got.HasPrompt {
			checkTokens(t, got.Prompt, got.Tokens)
		}
		if raw, ok := top["messages"]; ok {
			var msgs []map[string]json.RawMessage
			if e := json.Unmarshal(raw, &msgs); e != nil {
				t.Fatalf("messages accepted but do not decode: %v", e)
			}
			if len(msgs) != len(got.Messages) {
				t.Fatalf("got %d messages, want %d", len(got.Messages), len(msgs))
			}
			for i, m := range msgs {
				checkString(t, m["role"], got.Messages[i].Role)
				if c, ok := m["content"]; ok {
					checkText(t, c, got.Messages[i].Content)
				}
			}
		}
	})
}

// checkTokens: the token ids a scan read from a prompt are what
// encoding/json reads from it as an array of unsigned 32-bit integers (each
// element on its own, so that a null is not taken for a 0), and a prompt
// encoding/json reads so, if not empty, gave token ids.
func checkTokens(t *testing.T, prompt []byte, got []uint32) {
	t.Helper()
	if want := jsonTokens(prompt); !slices.Equal(got, want) || (got == nil) != (want == nil) {
		t.Fatalf("Tokens %v, encoding/json reads %v (prompt %q)", got, want, prompt)
	}
}

// jsonTokens is what encoding/json reads from a prompt as a non-empty
// array of unsigned 32-bit integers, nil if it is not one.
func jsonTokens(prompt []byte) []uint32 {
	var elems []json.RawMessage
	if len(prompt) == 0 || prompt[0] != '[' || json.Unmarshal(prompt, &elems) != nil || len(elems) == 0 {
		return nil
	}
	want := make([]uint32, len(elems))
	for i, e := range elems {
		if len(e) == 0 || !isDigit(e[0]) || json.Unmarshal(e, &want[i]) != nil {
			return nil
		}
	}
	return want
}

func checkString(t *testing.T, raw json.RawMessage, got string) {
	t.Helper()
	if raw == nil {
		return
	}
	var want string
	if json.Unmarshal(raw, &want) != nil || !utf8.ValidString(got) {
		return
	}
	if want != got {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func checkText(t *testing.T, raw json.RawMessage, got []byte) {
	t.Helper()
	var want string
	if trimmed := bytes.TrimSpace(raw); len(trimmed) == 0 || trimmed[0] != '"' || json.Unmarshal(raw, &want) != nil {
		if !bytes.Equal(bytes.TrimSpace(raw), got) {
			t.Fatalf("raw value %q, want %q", got, raw)
		}
		return
	}
	if utf8.Valid(got) && want != string(got) {
		t.Fatalf("text %q, want %q", got, want)
	}
}

func BenchmarkScan16k(b *testing.B) {
	for _, bc := range []struct{ name, line string }{
		{"plain", "lorem ipsum "},
		// Prompts from files and chats: an escaped newline every line, a
		// quote now and then.
		{"escaped", `lorem ipsum dolor sit amet, \"consectetur\" adipiscing elit, sed do eiusmod tempor\n`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			body := []byte(`{"model":"m","stream":true,"messages":[{"role":"system","content":"` +
				strings.Repeat(bc.line, 16800/len(bc.line)) + `"},{"role":"user","content":"q"}]}`)
			b.SetBytes(int64(len(body)))
			var sc Scanner // as the router does: memory reused
			for b.Loop() {
				if _, err := sc.Scan(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestScanTokens: a flat array of token ids is read in the scan, with the
// ids TokenIDs reads from it; every other prompt, and every array that
// holds something else, gives no tokens and the same result as before.
func TestScanTokens(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []uint32
		err  string // "syntax", "field" or ""
	}{
		{body: `{"prompt":[1,2,3]}`, want: []uint32{1, 2, 3}},
		{body: "{\"prompt\":[ 0 ,\n 7\t,4294967295 ]}", want: []uint32{0, 7, 4294967295}},
		{body: `{"prompt":[4294967296]}`},              // valid JSON, too big for an id
		{body: `{"prompt":[99999999999999999999999]}`}, // far too big: no wrap-around
		{body: `{"prompt":[]}`},
		{body: `{"prompt":"1,2"}`},
		{body: `{"prompt":[[1,2]]}`},
		{body: `{"prompt":[1,2],"prompt":"x"}`},                        // the last prompt counts
		{body: `{"prompt":"x","prompt":[5]}`, want: []uint32{5}},       // the last prompt counts
		{body: `{"prompt":[1,2],"prompt":[3]}`, want: []uint32{3}},     // the last prompt counts
		{body: `{"prompt":[1,2],"messages":[]}`, want: []uint32{1, 2}}, // the router decides what counts
		{body: `{"prompt":[12345,1234567,12345678,0,0,7,99],"model":"m"}`, want: []uint32{12345, 1234567, 12345678, 0, 0, 7, 99}},
		{body: `{"prompt":[1,22 ,333, 4444,55555],"model":"m"}`, want: []uint32{1, 22, 333, 4444, 55555}},
		{body: `{"prompt":[7,0123,5],"model":"mmmmmmmm"}`, err: "syntax"},
		{body: `{"prompt":[7,12.5,5],"model":"mmmmmmmm"}`, err: "field"},
		{body: `{"prompt":[7,12e5,5],"model":"mmmmmmmm"}`, err: "field"},
		{body: `{"prompt":[7,1,,5],"model":"mmmmmmmm"}`, err: "syntax"},
		{body: `{"prompt":[1.5]}`, err: "field"},
		{body: `{"prompt":[1e3]}`, err: "field"},
		{body: `{"prompt":[1,-2]}`, err: "field"},
		{body: `{"prompt":[1,"a"]}`, err: "field"},
		{body: `{"prompt":[01]}`, err: "syntax"},
		{body: `{"prompt":[1,]}`, err: "syntax"},
		{body: `{"prompt":[1 2]}`, err: "syntax"},
		{body: `{"prompt":[1,2`, err: "syntax"},
		{body: `{"prompt":[1,2]`, err: "syntax"},
		{body: `{"prompt":[1,2]}x`, err: "syntax"},
	} {
		got, err := Scan([]byte(tc.body))
		switch {
		case tc.err == "syntax" && !IsSyntax(err), tc.err == "field" && (err == nil || IsSyntax(err)), tc.err == "" && err != nil:
			t.Errorf("%s: err %v, want %s", tc.body, err, cmp.Or(tc.err, "none"))
		case err == nil && (!slices.Equal(got.Tokens, tc.want) || (got.Tokens == nil) != (tc.want == nil)):
			t.Errorf("%s: tokens %v, want %v", tc.body, got.Tokens, tc.want)
		}
	}
	// A Scanner's token memory is reused, not shared across a later scan's
	// result in a way that changes an earlier value the caller copied.
	var sc Scanner
	a, _ := sc.Scan([]byte(`{"prompt":[1,2,3]}`))
	first := slices.Clone(a.Tokens)
	b, _ := sc.Scan([]byte(`{"prompt":"text"}`))
	if b.Tokens != nil || !slices.Equal(first, []uint32{1, 2, 3}) {
		t.Fatalf("second scan: tokens %v", b.Tokens)
	}
}

// TestScanTokensAgreesWithJSON: on token-id arrays of every shape (ids of
// 1 to 12 digits, leading zeros, signs, fractions, exponents, nulls,
// spaces, missing and extra commas, cut short anywhere) the scan accepts
// the body exactly when encoding/json does and reads the ids encoding/json
// reads, wherever the array falls in the body.
func TestScanTokensAgreesWithJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	id := func() string { return strconv.FormatUint(rng.Uint64N(1<<(4*(1+rng.IntN(8)))), 10) }
	elem := func() string {
		switch r := rng.IntN(40); {
		case r < 30:
			return id()
		case r < 31:
			return "0" + strconv.Itoa(rng.IntN(100))
		case r < 32:
			return "-" + strconv.Itoa(rng.IntN(100))
		case r < 33:
			return strconv.Itoa(rng.IntN(100)) + ".5"
		case r < 34:
			return strconv.Itoa(rng.IntN(100)) + "e2"
		case r < 35:
			return "null"
		case r < 36:
			return `"7"`
		case r < 37:
			return "4294967296"
		case r < 38:
			return ""
		default:
			return []string{" 5", "6 ", "\n7", "\t8\r"}[rng.IntN(4)]
		}
	}
	read := 0
	for round := range 20000 {
		clean := round%2 == 0 // ids and commas only: most arrays are read
		var p []byte
		p = append(p, '[')
		for i := range rng.IntN(60) {
			if i > 0 {
				sep := ","
				if !clean && rng.IntN(10) == 0 {
					sep = []string{",,", " ,", ", ", ""}[rng.IntN(4)]
				}
				p = append(p, sep...)
			}
			e := elem()
			if clean {
				e = id()
			}
			p = append(p, e...)
		}
		p = append(p, ']')
		if !clean && rng.IntN(10) == 0 {
			p = p[:rng.IntN(len(p)+1)]
		}
		for _, body := range [][]byte{
			append(append([]byte(`{"model":"m","prompt":`), p...), '}'),
			append(append([]byte(`{"prompt":`), p...), `,"model":"mmmmmmmmmmmmmmmm"}`...),
		} {
			got, err := Scan(body)
			valid := json.Valid(body)
			if IsSyntax(err) == valid {
				t.Fatalf("round %d: %q: err %v, but json.Valid says %v", round, body, err, valid)
			}
			if !valid {
				continue
			}
			var top map[string]json.RawMessage
			if e := json.Unmarshal(body, &top); e != nil {
				t.Fatal(e)
			}
			want := jsonTokens(top["prompt"])
			if err != nil {
				got.Tokens = nil // a field error: the prompt holds no ids
			}
			if !slices.Equal(got.Tokens, want) || (got.Tokens == nil) != (want == nil) {
				t.Fatalf("round %d: %q: tokens %v (err %v), encoding/json reads %v", round, body, got.Tokens, err, want)
			}
			if want != nil {
				read++
			}
		}
	}
	if read < 10000 {
		t.Fatalf("only %d bodies held token ids: the test checks too little", read)
	}
}

// BenchmarkScanTokens: a 4,000-token token-id prompt (the completions API's
// prompt as ids), read with its ids.
func BenchmarkScanTokens(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	body := []byte(`{"model":"m","stream":true,"prompt":[`)
	for i := range 4000 {
		if i > 0 {
			body = append(body, ',')
		}
		body = strconv.AppendUint(body, uint64(rng.Uint32N(150000)), 10)
	}
	body = append(body, "]}"...)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var sc Scanner
	for b.Loop() {
		req, err := sc.Scan(body)
		if err != nil || len(req.Tokens) != 4000 {
			b.Fatal(len(req.Tokens), err)
		}
	}
}

func TestNextSpecial(t *testing.T) {
	for n := range 40 {
		for at := range n {
			for c := range 256 {
				b := bytes.Repeat([]byte{'a'}, n)
				for k := at + 1; k < n; k++ {
					b[k] = byte(k * 37) // anything may follow, specials too
				}
				b[at] = byte(c)
				want := n
				for k := at; k < n; k++ {
					if b[k] < 0x20 || b[k] == '"' || b[k] == '\\' {
						want = k
						break
					}
				}
				if got := nextSpecial(b, 0); got != want {
					t.Fatalf("%q: got %d, want %d", b, got, want)
				}
				if n > 1 && c == '"' {
					if got := nextSpecial(b, at+1); got <= at {
						t.Fatalf("%q from %d: got %d", b, at+1, got)
					}
				}
			}
		}
	}
}

// TestAttention: in any word, the lowest byte attention flags is the first
// control character, quote or backslash, whatever bytes come before it
// (every value that is none of those, the neighbours of the special ones
// most often) and after it; a word with none of them is not flagged.
func TestAttention(t *testing.T) {
	special := func(c byte) bool { return c < 0x20 || c == '"' || c == '\\' }
	near := []byte{0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff, 'a'}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 200 {
		for at := range 9 { // 8: no special byte
			for c := range 256 {
				var w [8]byte
				for i := range w {
					switch {
					case i < at:
						w[i] = near[rng.IntN(len(near))]
						for special(w[i]) || rng.IntN(4) == 0 {
							w[i] = byte(rng.IntN(256))
						}
					case i == at:
						w[i] = byte(c)
					default:
						w[i] = byte(rng.IntN(256))
					}
				}
				want := 8
				for i, b := range w {
					if special(b) {
						want = i
						break
					}
				}
				m := attention(binary.LittleEndian.Uint64(w[:]))
				if got := bits.TrailingZeros64(m) / 8; got != want {
					t.Fatalf("attention(%q) flags byte %d first, want %d", w, got, want)
				}
			}
		}
	}
}

func TestStringDecodes(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{`plain`, "plain"},
		{`a\nb\tc\rd\be\ff`, "a\nb\tc\rd\be\ff"},
		{`\"q\" \\ \/`, `"q" \ /`},
		{`\u00e9\u4E2D`, "é中"},
		{`\ud83d\ude00!`, "😀!"},
		{`\ud83d`, "\ufffd"},               // lone high half
		{`\ude00x`, "\ufffdx"},             // lone low half
		{`\ud83d\u0041`, "\ufffdA"},        // a half, then a rune of its own
		{`\ud83d\\ude00`, "\ufffd\\ude00"}, // an escaped backslash is no pair
		{"caf\xc3\xa9\\n", "café\n"},
	} {
		s := scanner{b: []byte(`"` + tc.raw + `"`)}
		got, err := s.str(true)
		if err != nil || string(got) != tc.want {
			t.Errorf("str(%q) = %q, %v; want %q", tc.raw, got, err, tc.want)
		}
		s = scanner{b: []byte(`"` + tc.raw + `"`)}
		if raw, err := s.str(false); err != nil || string(raw) != tc.raw {
			t.Errorf("str(%q) undecoded = %q, %v", tc.raw, raw, err)
		}
	}
}

// FuzzString checks the string scanner against encoding/json on every
// string body: the same ones accepted, the same text decoded.
func FuzzString(f *testing.F) {
	f.Add(`a\nb`)
	f.Add(`\ud83d\ude00\u00e9\"`)
	f.Add(`\ud83d\ud83d\ude00`)
	f.Add("tab\tin")
	f.Fuzz(func(t *testing.T, body string) {
		quoted := []byte(`"` + body + `"`)
		s := scanner{b: quoted}
		got, err := s.str(true)
		valid := json.Valid(quoted)
		if err != nil || s.i != len(quoted) {
			if valid {
				t.Fatalf("rejected valid %q: %v", quoted, err)
			}
			return
		}
		var want string
		if err := json.Unmarshal(quoted, &want); err != nil {
			t.Fatalf("accepted %q, encoding/json did not: %v", quoted, err)
		}
		if utf8.Valid(quoted) && string(got) != want {
			t.Fatalf("str(%q) = %q, want %q", quoted, got, want)
		}
		s = scanner{b: quoted}
		if raw, err := s.str(false); err != nil || string(raw) != body {
			t.Fatalf("str(%q) undecoded = %q, %v", quoted, raw, err)
		}
	})
}

// TestScannerReuse: a Scanner's second Scan is as right as its first, and
// decoding escapes costs no allocation once its memory has grown.
func TestScannerReuse(t *testing.T) {
	chat := func(content string) []byte {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
			{"role": "system", "content": "be brief"}, {"role": "user", "content": content}}})
		return b
	}
	lines := strings.Repeat("a line of \"code\"\n", 500)
	var sc Scanner
	for _, content := range []string{lines, "plain", lines + "é\t"} {
		req, err := sc.Scan(chat(content))
		if err != nil || len(req.Messages) != 2 || string(req.Messages[1].Content) != content || string(req.Messages[0].Content) != "be brief" {
			t.Fatalf("scan of %.20q: %v, %+v", content, err, req.Messages)
		}
	}
	escaped, plain := chat(lines), chat(strings.Repeat("a line of code. ", 500))
	allocs := func(body []byte) float64 {
		return testing.AllocsPerRun(50, func() {
			if _, err := sc.Scan(body); err != nil {
				t.Fatal(err)
			}
		})
	}
	if e, p := allocs(escaped), allocs(plain); e > p {
		t.Fatalf("decoding escapes allocates: %v allocations per scan, %v without escapes", e, p)
	}
}

// TestSyntaxErrorsSayWhat: a NUL byte is a bad character, not the end of the
// body (the scanner's peek returns 0 for both).
func TestSyntaxErrorsSayWhat(t *testing.T) {
	for body, want := range map[string]string{
		"\x00":                "byte 0: invalid character",
		`{"model":` + "\x00}": "byte 9: invalid character",
		`{"model":`:           "unexpected end of input",
		`{"a":[1,` + "\x00]}": "byte 8: invalid character",
		`{"a":[1,`:            "unexpected end of input",
	} {
		_, err := Scan([]byte(body))
		if !IsSyntax(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want a syntax error saying %q", body, err, want)
		}
	}
}

// TestNonDigits: the word-at-a-time reading finds every byte that is not a
// digit, whatever follows a run of digits, and reads the run's value.
func TestNonDigits(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for k := range 8 {
		for c := range 256 {
			var w [8]byte
			for i := range w {
				w[i] = byte(rng.IntN(256))
				if rng.IntN(2) == 0 {
					w[i] = '0' + byte(rng.IntN(10))
				}
			}
			for i := range k {
				w[i] = '0' + byte(rng.IntN(10))
			}
			if k < 8 {
				w[k] = byte(c)
			}
			var want uint64
			for i, b := range w {
				if !isDigit(b) {
					want |= 0x80 << (8 * i)
				}
			}
			x := binary.LittleEndian.Uint64(w[:])
			if got := nonDigits(x); got != want {
				t.Fatalf("nonDigits(%q) = %#x, want %#x", w, got, want)
			}
			var gathered uint64
			for i := range 8 {
				gathered |= want >> (8*i + 7) & 1 << i
			}
			if got := highBits(want); got != gathered {
				t.Fatalf("highBits(%#x) = %#x, want %#x", want, got, gathered)
			}
			if n := bits.TrailingZeros64(want) / 8; n > 0 && n < 8 {
				v, _ := strconv.ParseUint(string(w[:n]), 10, 32)
				if got := parseDigits(x, n); uint64(got) != v {
					t.Fatalf("parseDigits(%q, %d) = %d, want %d", w, n, got, v)
				}
			}
		}
	}
}
