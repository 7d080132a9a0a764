package bench

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/router/balance"
)

func TestWriteSVG(t *testing.T) {
	sr := func(st balance.Strategy, ts ...float64) StrategyResult {
		return StrategyResult{Strategy: st, TTFTs: ts, TTFTp50: ts[len(ts)/2]}
	}
	r := &Results{Options: OptionsSummary{Backends: 8, Load: 0.8}, Workloads: []WorkloadResult{
		{Name: "rag", Strategies: []StrategyResult{sr(balance.Random, 0.4, 0.8, 1.6), sr(balance.PrefixAware, 0.002, 0.003, 0.4)}},
		{Name: "a<b&c", Strategies: []StrategyResult{sr(balance.LeastOutstanding, 0.1)}},
		{Name: "empty"}, // no strategies: no panel
	}}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, r); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	paths, texts := 0, []string{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed SVG: %v\n%s", err, buf.String())
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if el.Name.Local == "path" {
				paths++
				for _, a := range el.Attr {
					if a.Name.Local == "d" && !strings.HasPrefix(a.Value, "M") {
						t.Fatalf("path data %q", a.Value)
					}
				}
			}
		case xml.CharData:
			texts = append(texts, string(el))
		}
	}
	if paths != 3 {
		t.Fatalf("%d curves, want one per strategy with samples (3)", paths)
	}
	all := strings.Join(texts, "|")
	for _, want := range []string{"rag", "a<b&c", "prefix-aware p50 3ms", "random p50 800ms"} {
		if !strings.Contains(all, want) {
			t.Fatalf("missing label %q in %q", want, all)
		}
	}
	// Decade grid lines of the first panel are evenly spaced (log axis).
	var xs []float64
	for _, line := range strings.Split(buf.String(), "\n") {
		var x1, y1, x2, y2 float64
		if n, _ := fmt.Sscanf(line, `<line x1="%g" y1="%g" x2="%g" y2="%g"`, &x1, &y1, &x2, &y2); n == 4 && x1 == x2 && x1 < 420 {
			xs = append(xs, x1)
		}
	}
	if len(xs) < 3 {
		t.Fatalf("decade lines %v", xs)
	}
	for i := 2; i < len(xs); i++ {
		if d0, d := xs[1]-xs[0], xs[i]-xs[i-1]; math.Abs(d-d0) > 0.2 {
			t.Fatalf("decades not evenly spaced: %v", xs)
		}
	}
	if strings.Contains(all, "empty") {
		t.Fatal("drew a panel for a workload without results")
	}
}
