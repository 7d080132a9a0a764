// Package oai reads the parts of an OpenAI-style request body that routing
// needs (model, prompt or chat messages, cache_salt, ...) without decoding
// the whole body into Go values, and writes OpenAI-style JSON errors.
//
// The scanner validates the entire body as JSON (so a malformed body is
// rejected before it reaches a backend) in one pass. It keeps the prompt as a
// sub-slice of the body when it holds no escape sequences, and otherwise
// decodes it in that same pass into memory a Scanner reuses, so a prompt
// costs no allocation either way.
package oai

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth mirrors encoding/json's nesting limit so both accept the same bodies.
const maxDepth = 10000

// Request is what routing needs from a completions or chat completions body.
type Request struct {
	Model string
	// Prompt is the completions prompt: the unescaped text when it is a JSON
	// string, otherwise the raw JSON of the value (token ids, batches).
	Prompt    []byte
	HasPrompt bool
	// Tokens are the prompt's token ids when it is a flat array of them,
	// each at most 2^32-1 (what TokenIDs accepts), read in the same pass;
	// nil otherwise (a string, a batch, an empty array).
	Tokens []uint32
	// Messages are the chat messages in order.
	Messages    []Message
	HasMessages bool
	CacheSalt   string
	User        string
	Stream      bool
	// MaxTokens is max_completion_tokens or else max_tokens; -1 when absent.
	MaxTokens int
}

// Message is one chat message. Content is the unescaped text when the
// content is a JSON string, otherwise the raw JSON (parts arrays, null).
type Message struct {
	Role    string
	Content []byte
}

// SyntaxError reports malformed JSON at a byte offset.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.Msg)
}

// FieldError reports a well-formed body whose field has the wrong type.
type FieldError struct {
	Field string
	Want  string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("field %q must be %s", e.Field, e.Want)
}

// Scan validates body as a JSON object and extracts the routing fields.
// Unknown fields are validated and skipped. Returned byte slices may alias body.
func Scan(body []byte) (Request, error) {
	var sc Scanner
	return sc.Scan(body)
}

// A Scanner is Scan with memory it keeps between calls: the decoded text of
// strings that hold escapes (most chat prompts: an escaped newline every
// line) and the message list. A router that scans every request reuses
// Scanners so that decoding a long prompt allocates nothing. The Request a
// Scanner returns is valid until its next Scan.
type Scanner struct {
	text  []byte
	msgs  []Message
	toks  []uint32
	model string // the last model named, reused while the next names it too
}

// maxKeptTokens bounds the token memory a Scanner keeps for the next scan:
// a rare huge prompt's is left to the garbage collector.
const maxKeptTokens = 1 << 16

// Scan is Scan, reusing sc's memory.
func (sc *Scanner) Scan(body []byte) (Request, error) {
	req := Request{MaxTokens: -1, Messages: sc.msgs[:0]}
	s := scanner{b: body, text: sc.text[:0], toks: sc.toks[:0]}
	defer func() {
		sc.msgs, sc.text, sc.toks = req.Messages[:0], s.text[:0], s.toks[:0]
		if cap(sc.toks) > maxKeptTokens {
			sc.toks = nil
		}
	}()
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		if s.i >= len(s.b) {
			return req, s.errf("empty body")
		}
		if err := s.value(0); err != nil {
			return req, err
		}
		if s.ws(); s.i != len(s.b) {
			return req, s.errf("unexpected data after top-level value")
		}
		return req, &FieldError{Field: "(body)", Want: "a JSON object"}
	}
	maxTokens, maxCompletion := -1, -1
	err := s.object(0, func(key []byte) error {
		switch string(key) { // no conversion: the cases are constants
		case "model":
			v, err := s.stringField("model")
			if string(v) != sc.model { // most requests name the model the last one did
				sc.model = string(v)
			}
			req.Model = sc.model
			return err
		case "cache_salt":
			v, err := s.stringField("cache_salt")
			req.CacheSalt = string(v)
			return err
		case "user":
			if s.peek() == 'n' {
				req.User = ""
				return s.literal("null")
			}
			v, err := s.stringField("user")
			req.User = string(v)
			return err
		case "stream":
			switch s.peek() {
			case 't':
				req.Stream = true
				return s.literal("true")
			case 'f':
				req.Stream = false
				return s.literal("false")
			case 'n':
				req.Stream = false
				return s.literal("null")
			}
			if err := s.value(1); err != nil {
				return err
			}
			return s.typeErr("stream", "a boolean")
		case "max_tokens":
			n, err := s.intField("max_tokens")
			maxTokens = n
			return err
		case "max_completion_tokens":
			n, err := s.intField("max_completion_tokens")
			maxCompletion = n
			return err
		case "prompt":
			req.HasPrompt, req.Tokens = true, nil
			if s.peek() == '"' {
				v, err := s.str(true)
				req.Prompt = v
				return err
			}
			if s.peek() != '[' {
				if err := s.value(1); err != nil {
					return err
				}
				return s.typeErr("prompt", promptWant)
			}
			start := s.i
			if s.tokenArray() {
				req.Prompt, req.Tokens = body[start:s.i], s.toks
				return nil
			}
			if err := s.promptArray(); err != nil {
				return err
			}
			req.Prompt = body[start:s.i]
			return nil
		case "messages":
			req.HasMessages = true
			msgs, err := s.messages(req.Messages[:0])
			req.Messages = msgs
			return err
		}
		return s.value(1)
	})
	if err != nil {
		return req, err
	}
	s.ws()
	if s.i != len(s.b) {
		return req, s.errf("unexpected data after top-level value")
	}
	if s.ferr != nil {
		return req, s.ferr
	}
	req.MaxTokens = maxTokens
	if maxCompletion >= 0 {
		req.MaxTokens = maxCompletion
	}
	return req, nil
}

type scanner struct {
	b    []byte
	i    int
	text []byte      // where decoded strings go
	toks []uint32    // where tokenArray puts token ids
	ferr *FieldError // first field of the wrong type; reported only if the JSON is valid
}

// typeErr records a wrong-typed field and lets the scan continue, so that
// malformed JSON later in the body is still reported as such.
func (s *scanner) typeErr(field, want string) error {
	if s.ferr == nil {
		s.ferr = &FieldError{Field: field, Want: want}
	}
	return nil
}

func (s *scanner) errf(format string, args ...any) error {
	return &SyntaxError{Offset: s.i, Msg: fmt.Sprintf(format, args...)}
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte (0 at the end) without consuming it.
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// object walks an object, calling field with the position at each value;
// field must consume exactly one value.
func (s *scanner) object(depth int, field func(key []byte) error) error {
	if depth+1 > maxDepth {
		return s.errf("exceeded max depth")
	}
	s.i++ // '{'
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.errf("expected string key")
		}
		key, err := s.str(true)
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return s.errf("expected ':' after key")
		}
		s.i++
		s.ws()
		if err := field(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.errf("expected ',' or '}' in object")
		}
	}
}

// array walks an array, calling elem at each element; elem must consume it.
func (s *scanner) array(depth int, elem func() error) error {
	if depth+1 > maxDepth {
		return s.errf("exceeded max depth")
	}
	s.i++ // '['
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for {
		s.ws()
		if err := elem(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return s.errf("expected ',' or ']' in array")
		}
	}
}

const promptWant = "a string, or an array of strings, of token ids or of token id arrays"

// promptArray walks an array prompt. The OpenAI API takes strings, token
// ids, or arrays of token ids, not a mix: anything else is a field error,
// reported once the whole body has been checked for syntax.
func (s *scanner) promptArray() error {
	var kind byte // the first element's: '"', '0' (a token id) or '['
	ok := true
	tokenID := func() error {
		start := s.i
		if err := s.number(); err != nil {
			return err
		}
		for _, c := range s.b[start:s.i] {
			ok = ok && isDigit(c) // no sign, fraction or exponent
		}
		return nil
	}
	err := s.array(1, func() error {
		k := s.peek()
		if k == '-' || isDigit(k) {
			k = '0'
		}
		if kind == 0 {
			kind = k
		}
		ok = ok && k == kind
		switch k {
		case '"':
			_, err := s.str(false)
			return err
		case '0':
			return tokenID()
		case '[':
			return s.array(2, func() error {
				if c := s.peek(); c != '-' && !isDigit(c) {
					ok = false
					return s.value(3)
				}
				return tokenID()
			})
		}
		ok = false
		return s.value(2)
	})
	if err == nil && !ok {
		return s.typeErr("prompt", promptWant)
	}
	return err
}

// tokenArray reads, at an array, a flat array of token ids each at most
// 2^32-1 into s.toks: a token-id prompt is thousands of them, and the
// router needs their values. Anything else (another element, a bigger
// number, a fraction, bad syntax) reports false having consumed nothing,
// and promptArray then reads the array as usual, errors and all. Where it
// reports true, promptArray would have accepted the array as it is and
// TokenIDs would have returned the same ids.
func (s *scanner) tokenArray() bool {
	b, i := s.b, s.i+1 // past '['
	toks := s.toks[:0]
	for {
		// Most elements are an id of at most 7 digits and a comma: read
		// as many as there are that way, then one element the byte-wise
		// way (spaces, longer ids, the end of the array) and back.
		var done bool
		if i, toks, done = fastTokens(b, i, toks); done {
			s.i, s.toks = i, toks
			return true
		}
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		n := uint64(b[i] - '0')
		i++
		if n != 0 { // JSON has no leading zeros: a 0 ends its number
			for i < len(b) && isDigit(b[i]) {
				if n = n*10 + uint64(b[i]-'0'); n > 1<<32-1 {
					return false
				}
				i++
			}
		}
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i >= len(b) {
			return false
		}
		toks = append(toks, uint32(n))
		switch b[i] {
		case ',':
			i++
		case ']':
			s.i, s.toks = i+1, toks
			return true
		default:
			return false // a fraction, an exponent, a digit after a leading 0, ...
		}
	}
}

// fastTokens reads, from i (where an element starts), the elements that
// are ids of 1 to 7 digits without a leading zero, each followed at once
// by a comma or, ending the array, by a bracket: it returns where it
// stopped (past the bracket when done, else at the start of the element it
// left to the byte-wise reading) and the ids appended to toks.
//
// It first marks the bytes that are not digits in a stretch of 64
// (seps), then reads the ids between the marks: no step waits for the id
// before it to be read, and the branch that ends the inner loop is
// mispredicted once a stretch rather than once every word or two. The
// marks are cut where an id's word would pass the end of b, so the inner
// loop checks only the id (its length, its first digit, its separator):
// this loop is most of the router's work for a token-id prompt. An id
// that ends within 7 bytes of the end of b is left to the byte-wise
// reading.
func fastTokens(b []byte, i int, toks []uint32) (int, []uint32, bool) {
	start := i // of the element being read
	for base := i; base+8 <= len(b); {
		seps, n := nonDigitMarks(b, base)
		if last := len(b) - 6 - base; last < 64 {
			// The marks go up to where an id of one digit still has its
			// word in b; a longer id ending there starts earlier.
			seps &= 1<<uint(last) - 1
		}
		for ; seps != 0; seps &= seps - 1 {
			end := base + bits.TrailingZeros64(seps)
			k := end - start
			if uint(k-1) > 6 {
				return start, toks, false
			}
			x := binary.LittleEndian.Uint64(b[start : start+8]) // start < end <= len(b)-7
			c := b[end]
			if byte(x) == '0' && k > 1 || c != ',' && c != ']' {
				return start, toks, false
			}
			toks = append(toks, parseDigits(x, k))
			start = end + 1
			if c != ',' {
				return start, toks, true
			}
		}
		base += n
	}
	return start, toks, false
}

// nonDigitMarks marks the bytes of b from base that are not digits, bit j
// for b[base+j], in a stretch of 64 bytes or, nearer the end of b, of as
// many whole words as are left: it returns the marks and the stretch's
// length. The whole stretch is one slice and its eight words are read
// unrolled, so that they cost no bounds checks and no loop.
func nonDigitMarks(b []byte, base int) (uint64, int) {
	if base+64 > len(b) {
		var m uint64
		n := 0
		for ; base+n+8 <= len(b); n += 8 {
			m |= highBits(nonDigits(binary.LittleEndian.Uint64(b[base+n:base+n+8]))) << n
		}
		return m, n
	}
	w := b[base : base+64 : base+64]
	return highBits(nonDigits(binary.LittleEndian.Uint64(w[0:8]))) |
		highBits(nonDigits(binary.LittleEndian.Uint64(w[8:16])))<<8 |
		highBits(nonDigits(binary.LittleEndian.Uint64(w[16:24])))<<16 |
		highBits(nonDigits(binary.LittleEndian.Uint64(w[24:32])))<<24 |
		highBits(nonDigits(binary.LittleEndian.Uint64(w[32:40])))<<32 |
		highBits(nonDigits(binary.LittleEndian.Uint64(w[40:48])))<<40 |
		highBits(nonDigits(binary.LittleEndian.Uint64(w[48:56])))<<48 |
		highBits(nonDigits(binary.LittleEndian.Uint64(w[56:64])))<<56, 64
}

// highBits gathers the high bits of m's bytes (the only bits set) into its
// low eight bits, byte j's to bit j: each lands at bit 56+j of the
// product, where nothing else does and no carry reaches.
func highBits(m uint64) uint64 { return (m >> 7) * 0x0102040810204080 >> 56 }

// nonDigits has the high bit set of each of x's bytes that is not an
// ASCII digit.
func nonDigits(x uint64) uint64 {
	y := x &^ highs                            // the low seven bits of each byte
	above := y + ones*(0x7f-'9')               // high bit where y > '9'
	below := ^((y | highs) - ones*'0') & highs // high bit where y < '0'
	return (above | below | x) & highs
}

// parseDigits is the value of x's k (1 to 7) lowest bytes, ASCII digits,
// the lowest the most significant: shifted up so the bytes below them read
// as leading zeros, then summed pairwise in three multiplications.
func parseDigits(x uint64, k int) uint32 {
	x = (x & (ones * 0x0f)) << (uint(8-k) * 8 & 63) // & 63: no check for a shift past 63
	x = (x * (1 + 10<<8)) >> 8 & 0x00ff00ff00ff00ff
	x = (x * (1 + 100<<16)) >> 16 & 0x0000ffff0000ffff
	return uint32((x * (1 + 10000<<32)) >> 32)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// value validates and skips one JSON value at depth.
func (s *scanner) value(depth int) error {
	switch s.peek() {
	case '{':
		return s.object(depth, func([]byte) error { return s.value(depth + 1) })
	case '[':
		return s.array(depth, func() error { return s.value(depth + 1) })
	case '"':
		_, err := s.str(false)
		return err
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	case 0:
		if s.i < len(s.b) { // a NUL byte, not the end
			return s.errf("invalid character")
		}
		return s.errf("unexpected end of input")
	default:
		return s.number()
	}
}

func (s *scanner) literal(lit string) error {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return s.errf("invalid literal")
	}
	s.i += len(lit)
	return nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (s *scanner) number() error {
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case s.i < len(s.b) && s.b[s.i] >= '1' && s.b[s.i] <= '9':
		for s.i < len(s.b) && isDigit(s.b[s.i]) {
			s.i++
		}
	default:
		s.i = start
		return s.errf("invalid character")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if s.i >= len(s.b) || !isDigit(s.b[s.i]) {
			return s.errf("invalid number")
		}
		for s.i < len(s.b) && isDigit(s.b[s.i]) {
			s.i++
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if s.i >= len(s.b) || !isDigit(s.b[s.i]) {
			return s.errf("invalid number")
		}
		for s.i < len(s.b) && isDigit(s.b[s.i]) {
			s.i++
		}
	}
	return nil
}

func isHex(c byte) bool {
	return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// str consumes a string and returns the bytes between the quotes: a
// sub-slice of the body, unless decode is set and they hold escapes. Then it
// returns them decoded, as encoding/json does, except that bytes that are
// not valid UTF-8 are kept as they are (as where there are no escapes).
// Decoded text goes to s.text, whose memory a Scanner keeps: a chat prompt
// has an escaped newline every line, so this is on the path of most
// requests, and it takes one pass and no allocation.
func (s *scanner) str(decode bool) ([]byte, error) {
	b := s.b
	i := s.i + 1               // past the opening quote
	start, seg, at := i, i, -1 // at: where this string's decoded text starts in s.text
	for {
		i = nextSpecial(b, i)
		s.i = i
		switch {
		case i == len(b):
			return nil, s.errf("unterminated string")
		case b[i] == '"':
			s.i = i + 1
			if at < 0 {
				return b[start:i], nil
			}
			s.text = append(s.text, b[seg:i]...)
			return s.text[at:len(s.text):len(s.text)], nil
		case b[i] < 0x20:
			return nil, s.errf("control character in string")
		}
		var r rune
		n := 2
		if i+1 < len(b) && simpleEscapes[b[i+1]] != 0 {
			r = rune(simpleEscapes[b[i+1]]) // \n, \", \\ ...: most escapes, decoded inline
		} else {
			var msg string
			if r, n, msg = unicodeEscape(b[i:]); n == 0 {
				return nil, s.errf("%s", msg)
			}
		}
		if decode {
			if at < 0 {
				at = len(s.text)
			}
			s.text = append(s.text, b[seg:i]...)
			if r < utf8.RuneSelf {
				s.text = append(s.text, byte(r))
			} else {
				s.text = utf8.AppendRune(s.text, r)
			}
		}
		i += n
		seg = i
	}
}

// simpleEscapes maps the letter after a backslash to the byte it stands
// for, for the two-byte escapes (0: not one).
var simpleEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// unicodeEscape reads the escape sequence at the start of p (p[0] is a
// backslash) that is not one of the simpleEscapes: what a \\u escape stands
// for and its length, or a length of 0 and why the sequence is invalid. A
// \\u escape holding the first half of a UTF-16 pair takes the next escape
// too when that is the second half; a lone half stands for U+FFFD, and what
// follows it is read on its own, as in encoding/json.
func unicodeEscape(p []byte) (r rune, n int, invalid string) {
	if len(p) < 2 {
		return 0, 0, "unterminated escape"
	}
	if p[1] != 'u' {
		return 0, 0, "invalid escape"
	}
	if !isHex4(p[2:]) {
		return 0, 0, "invalid \\u escape"
	}
	r = hex4(p[2:])
	if !utf16.IsSurrogate(r) {
		return r, 6, ""
	}
	if len(p) >= 12 && p[6] == '\\' && p[7] == 'u' && isHex4(p[8:]) {
		if pair := utf16.DecodeRune(r, hex4(p[8:])); pair != unicode.ReplacementChar {
			return pair, 12, ""
		}
	}
	return unicode.ReplacementChar, 6, ""
}

func isHex4(p []byte) bool {
	return len(p) >= 4 && isHex(p[0]) && isHex(p[1]) && isHex(p[2]) && isHex(p[3])
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// nextSpecial returns the index of the first control character, quote or
// backslash in b at or after i, or len(b). The bulk of a prompt needs no
// attention, so it goes sixteen bytes at a time; in a word that needs it,
// the lowest flagged byte is the first special one (a borrow only runs
// upwards, from a byte that is itself special).
func nextSpecial(b []byte, i int) int {
	for ; i+16 <= len(b); i += 16 {
		p := b[i : i+16]
		if m := attention(binary.LittleEndian.Uint64(p)); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
		if m := attention(binary.LittleEndian.Uint64(p[8:])); m != 0 {
			return i + 8 + bits.TrailingZeros64(m)/8
		}
	}
	if i+8 <= len(b) {
		if m := attention(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
		i += 8
	}
	for ; i < len(b); i++ {
		if c := b[i]; c < 0x20 || c == '"' || c == '\\' {
			break
		}
	}
	return i
}

// attention is non-zero when some byte of x is a control character, a quote
// or a backslash, and its lowest set bit is in the first such byte (SWAR: a
// byte's high bit survives only where the subtraction borrowed, i.e. where
// the byte was below the bound, and a borrow only runs upwards, from a byte
// that is itself flagged). Flipping bit 1 turns a quote into 0x20 and keeps
// the control characters below it, so one comparison finds both, in the
// loop every byte of a prompt goes through.
func attention(x uint64) uint64 {
	q := x ^ (ones * 0x02)
	s := x ^ (ones * '\\')
	return ((q-ones*0x21)&^q | (s-ones)&^s) & highs
}

// hex4 decodes four hex digits that isHex4 accepted.
func hex4(p []byte) rune {
	var r rune
	for _, c := range p[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

func (s *scanner) stringField(name string) ([]byte, error) {
	if s.peek() != '"' {
		if err := s.value(1); err != nil {
			return nil, err
		}
		return nil, s.typeErr(name, "a string")
	}
	return s.str(true)
}

func (s *scanner) intField(name string) (int, error) {
	switch s.peek() {
	case 'n':
		return -1, s.literal("null")
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
	default:
		if err := s.value(1); err != nil {
			return -1, err
		}
		return -1, s.typeErr(name, "a non-negative integer")
	}
	start := s.i
	if err := s.number(); err != nil {
		return -1, err
	}
	n, err := strconv.Atoi(string(s.b[start:s.i]))
	if err != nil || n < 0 {
		return -1, s.typeErr(name, "a non-negative integer")
	}
	return n, nil
}

func (s *scanner) messages(dst []Message) ([]Message, error) {
	if s.peek() != '[' {
		if err := s.value(1); err != nil {
			return nil, err
		}
		return nil, s.typeErr("messages", "an array")
	}
	err := s.array(1, func() error {
		if s.peek() != '{' {
			if err := s.value(2); err != nil {
				return err
			}
			return s.typeErr("messages[]", "an object")
		}
		var m Message
		err := s.object(2, func(key []byte) error {
			k := string(key)
			switch k {
			case "role":
				v, err := s.stringField("role")
				m.Role = role(v)
				return err
			case "content":
				if s.peek() == '"' {
					v, err := s.str(true)
					m.Content = v
					return err
				}
				start := s.i
				err := s.value(3)
				m.Content = s.b[start:s.i]
				return err
			}
			return s.value(3)
		})
		dst = append(dst, m)
		return err
	})
	return dst, err
}

// role is a message's role as a string, without an allocation for the
// roles the API defines.
func role(v []byte) string {
	switch string(v) {
	case "system":
		return "system"
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	case "tool":
		return "tool"
	case "developer":
		return "developer"
	}
	return string(v)
}

// IsSyntax reports whether err is malformed JSON (as opposed to a field of
// the wrong type).
func IsSyntax(err error) bool {
	var se *SyntaxError
	return errors.As(err, &se)
}
