package kvevents

import (
	"slices"
	"testing"
)

// The exact values are checked against the simulator itself
// (TestInferenceSimEvents); here, the chain's shape.
func TestLLMDChainShape(t *testing.T) {
	p := tokens(0, 40)
	a := LLMDChain("1", "m", p, 16)
	if len(a) != 2 {
		t.Fatalf("%d hashes for 2 full blocks", len(a))
	}
	q := append(slices.Clone(p[:16]), tokens(100, 16)...)
	if b := LLMDChain("1", "m", q, 16); b[0] != a[0] || b[1] == a[1] {
		t.Fatalf("shared first block: %x vs %x", a, b)
	}
	for _, c := range [][]uint64{LLMDChain("2", "m", p, 16), LLMDChain("1", "n", p, 16), LLMDChain("1", "", p, 16)} {
		if c[0] == a[0] {
			t.Fatal("seed or model does not change the chain")
		}
	}
	if LLMDChain("1", "m", p, 0) != nil || len(LLMDChain("1", "m", p[:15], 16)) != 0 {
		t.Fatal("no full block must give no hash")
	}
}
