package s3origin

import (
	"encoding/base64"
	"fmt"
	"hash/crc32"

	"github.com/minio/crc64nvme"
)

// crcKind is a CRC S3 uses for full-object checksums. CRCs of adjacent
// ranges combine into the CRC of the whole (as zlib's crc32_combine does),
// so parts can be checked as they stream in, in parallel and in any order,
// and only parts fetched by an earlier run need reading back.
type crcKind struct {
	// poly is the reflected polynomial, width its degree (32 or 64).
	poly  uint64
	width uint
	// update continues a CRC over p, as hash/crc32 and hash/crc64 do
	// (pre- and post-inverted, so the CRC of nothing is 0).
	update func(crc uint64, p []byte) uint64
}

var crc32CTable = crc32.MakeTable(crc32.Castagnoli)

// crcKindFor returns the combinable CRC for a method, or nil.
func crcKindFor(method string) *crcKind {
	switch method {
	case MethodCRC64NVME:
		// minio/crc64nvme uses carry-less multiplication where the CPU has it:
		// 5-10x the table-driven hash/crc64 here, which was half the
		// daemon's CPU while downloading.
		return &crcKind{poly: crc64NVME, width: 64, update: crc64nvme.Update}
	case MethodCRC32C:
		return &crcKind{poly: uint64(crc32.Castagnoli), width: 32, update: func(c uint64, p []byte) uint64 { return uint64(crc32.Update(uint32(c), crc32CTable, p)) }}
	case MethodCRC32:
		return &crcKind{poly: uint64(crc32.IEEE), width: 32, update: func(c uint64, p []byte) uint64 { return uint64(crc32.Update(uint32(c), crc32.IEEETable, p)) }}
	}
	return nil
}

// multModP multiplies a and b modulo the polynomial, in the reflected bit
// order CRCs use (zlib's multmodp, any width).
func (k *crcKind) multModP(a, b uint64) uint64 {
	if a == 0 {
		return 0
	}
	m := uint64(1) << (k.width - 1)
	var p uint64
	for {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				break
			}
		}
		m >>= 1
		if b&1 != 0 {
			b = b>>1 ^ k.poly
		} else {
			b >>= 1
		}
	}
	return p
}

// x8nModP is x^(8n) modulo the polynomial: the effect of appending n bytes.
func (k *crcKind) x8nModP(n int64) uint64 {
	p := uint64(1) << (k.width - 1)  // x^0
	sq := uint64(1) << (k.width - 2) // x^1
	for range 3 {
		sq = k.multModP(sq, sq) // x^8 after three squarings
	}
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			p = k.multModP(sq, p)
		}
		sq = k.multModP(sq, sq)
	}
	return p
}

// combine returns the CRC of A followed by B from crc(A), crc(B) and len(B).
func (k *crcKind) combine(crcA, crcB uint64, lenB int64) uint64 {
	return k.multModP(k.x8nModP(lenB), crcA) ^ crcB
}

// decode turns S3's base64 big-endian checksum into a number.
func (k *crcKind) decode(b64 string) (uint64, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != int(k.width/8) {
		return 0, fmt.Errorf("checksum %q is not a base64 %d-bit value", b64, k.width)
	}
	var v uint64
	for _, b := range raw {
		v = v<<8 | uint64(b)
	}
	return v, nil
}

// encode is decode's inverse, for messages.
func (k *crcKind) encode(v uint64) string {
	raw := make([]byte, k.width/8)
	for i := len(raw) - 1; i >= 0; i-- {
		raw[i] = byte(v)
		v >>= 8
	}
	return base64.StdEncoding.EncodeToString(raw)
}
