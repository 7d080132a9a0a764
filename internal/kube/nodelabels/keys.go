package nodelabels

import (
	"crypto/sha256"
	"encoding/base32"
	"regexp"
	"strings"
)

// Label key prefixes. Everything under them belongs to warmfleet: the
// labeler adds and removes keys there and never touches any other key.
const (
	ModelPrefix = "cache.warmfleet.io/"
	ImagePrefix = "image.warmfleet.io/"
)

// ReadyValue is the value of every warmfleet label: the label exists only
// while the item is ready, so a selector matches on key and value alike.
const ReadyValue = "ready"

// MaxNameLen is Kubernetes' limit on the name part of a label key.
const MaxNameLen = 63

const (
	// hashLen base32 characters carry 80 bits of SHA-256.
	hashLen = 16
	// hashMark separates the readable part of a hashed key from its hash.
	// Keys of the other two forms never contain it.
	hashMark = ".."
	// orgMark stands for the '/' of "org/model". Keys of the plain form
	// never contain it.
	orgMark = "--"
	// readableLen is what is left of the name for the readable part of a
	// hashed key.
	readableLen = MaxNameLen - len(hashMark) - hashLen
)

// plainRE is a label key name part without its length limit.
var plainRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

var hashEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// KeyName maps any string (a model name, an image reference) to a label key
// name part: 1 to 63 characters of letters, digits, '-', '_' and '.', starting
// and ending with a letter or digit. Distinct strings get distinct names.
//
// Three forms, told apart by marks the other forms never contain:
//
//   - plain: a string that already is a valid name, holds neither "--" nor
//     "..", and fits in 63 characters is its own name:
//     "llama-3.1-8b" -> "llama-3.1-8b".
//   - org: "org/model" where org and model are each plain and the whole fits:
//     the '/' becomes "--" (which model names never contain):
//     "meta/llama-3-8b" -> "meta--llama-3-8b". The name holds exactly one "--",
//     so it splits back one way only.
//   - hashed: anything else keeps a readable part (characters outside the
//     name alphabet become '-', leading ones that are not letters or digits
//     are dropped, cut to 45 characters, "x" if nothing is left), then "..",
//     then 16 base32 characters of the SHA-256 of the whole string:
//     "docker.io/vllm/vllm-openai:v0.6.0" -> "docker.io-vllm-vllm-openai-v0.6.0..<hash>".
//     Two hashed names are equal only if 80 bits of SHA-256 collide.
func KeyName(s string) string {
	if isPlain(s) {
		return s
	}
	if org, model, ok := strings.Cut(s, "/"); ok && isPlain(org) && isPlain(model) && len(org)+len(orgMark)+len(model) <= MaxNameLen {
		return org + orgMark + model
	}
	sum := sha256.Sum256([]byte(s))
	return readable(s) + hashMark + hashEncoding.EncodeToString(sum[:])[:hashLen]
}

func isPlain(s string) bool {
	return len(s) <= MaxNameLen && plainRE.MatchString(s) && !strings.Contains(s, orgMark) && !strings.Contains(s, hashMark)
}

func readable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < readableLen; i++ {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		switch {
		case alnum:
			b.WriteByte(c)
		case b.Len() == 0:
			// A name starts with a letter or digit.
		case c == '-' || c == '_' || c == '.':
			b.WriteByte(c)
		default:
			b.WriteByte('-')
		}
	}
	if b.Len() == 0 {
		return "x"
	}
	return b.String()
}

// ModelKey is the label (and annotation) key of a model cache.
func ModelKey(name string) string { return ModelPrefix + KeyName(name) }

// ImageKey is the label (and annotation) key of a container image.
func ImageKey(ref string) string { return ImagePrefix + KeyName(ref) }

// Owned reports whether a label or annotation key is warmfleet's to manage.
func Owned(key string) bool {
	return strings.HasPrefix(key, ModelPrefix) || strings.HasPrefix(key, ImagePrefix)
}
