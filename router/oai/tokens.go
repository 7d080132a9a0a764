package oai

// TokenIDs parses a completions prompt given as a flat JSON array of token
// ids (the raw JSON Scan keeps in Request.Prompt) into dst; ok is false for anything
// else (a string, a batch of prompts, an id over 2^32-1).
func TokenIDs(raw []byte, dst []uint32) ([]uint32, bool) {
	if len(raw) < 2 || raw[0] != '[' || raw[len(raw)-1] != ']' {
		return dst, false
	}
	n, in, sep := uint64(0), false, true // sep: a separator came last (or the opening bracket)
	for _, c := range raw[1 : len(raw)-1] {
		switch {
		case c >= '0' && c <= '9':
			if !in && !sep {
				return dst, false // two numbers with only space between
			}
			n = n*10 + uint64(c-'0')
			if n > 1<<32-1 {
				return dst, false
			}
			in, sep = true, false
		case c == ',':
			if !in && sep {
				return dst, false
			}
			if in {
				dst = append(dst, uint32(n))
			}
			n, in, sep = 0, false, true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if in {
				dst = append(dst, uint32(n))
				n, in = 0, false
			}
		default:
			return dst, false
		}
	}
	if in {
		dst = append(dst, uint32(n))
	} else if sep && len(dst) > 0 {
		return dst, false // a trailing comma
	}
	return dst, true
}
