package oai

import (
	"fmt"
	"testing"
)

func TestTokenIDs(t *testing.T) {
	for in, want := range map[string][]uint32{
		"[1,2,3]":         {1, 2, 3},
		"[ 1 , 20 ,\n3 ]": {1, 20, 3},
		"[]":              {},
		"[4294967295]":    {4294967295},
	} {
		got, ok := TokenIDs([]byte(in), nil)
		if !ok || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("TokenIDs(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	for _, in := range []string{"[4294967296]", "[[1,2]]", `["a"]`, "[1,,2]", "[-1]", "[1.5]", "hello", "[,]", "[1 2", "[1 2]", "[1,]", "[1,2"} {
		if got, ok := TokenIDs([]byte(in), nil); ok {
			t.Errorf("TokenIDs(%q) = %v, accepted", in, got)
		}
	}
}
