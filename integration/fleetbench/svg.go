package fleetbench

import (
	"fmt"
	"html"
	"io"
	"math"

	"github.com/warmfleet/warmfleet/integration/netlab"
)

// WriteSVG plots, for each measured mode's median run, the bytes every host
// received over time, with the model size and the mode's lower bound marked.
// Hosts have timelines only when Options.SampleEvery was set.
func (r Result) WriteSVG(w io.Writer) error {
	const (
		width, panelH    = 900, 320
		left, right, top = 80, 120, 40
		bottom           = 50
		plotW            = width - left - right
		plotH            = panelH - top - bottom
	)
	var panels []ModeResult
	for _, m := range r.Modes {
		if m.Available && len(m.Hosts) > 0 && len(m.Hosts[0].Timeline) > 0 {
			panels = append(panels, m)
		}
	}
	if len(panels) == 0 {
		return fmt.Errorf("no timelines to plot (sample the run with SampleEvery)")
	}
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, panelH*len(panels))
	for p, m := range panels {
		y0 := p * panelH
		maxT, maxB := m.WarmSeconds, float64(r.ModelBytes)
		for _, h := range m.Hosts {
			for _, s := range h.Timeline {
				maxT, maxB = math.Max(maxT, s.Seconds), math.Max(maxB, float64(s.Bytes))
			}
		}
		maxT, maxB = maxT*1.02+1e-9, maxB*1.05
		x := func(t float64) float64 { return left + t/maxT*plotW }
		y := func(b float64) float64 { return float64(y0+top+plotH) - b/maxB*plotH }
		fmt.Fprintf(w, `<text x="%d" y="%d" font-size="14">%s: %d hosts, link %s, model %s: warm %.1f s, lower bound %.1f s (median run)</text>`+"\n",
			left, y0+24, html.EscapeString(m.Mode), r.Hosts, html.EscapeString(r.Link), netlab.Size(r.ModelBytes), m.WarmSeconds, m.LowerBoundSeconds)
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", left, y0+top, plotW, plotH)
		fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="4 3"/><text x="%d" y="%.1f" fill="#666">model %s</text>`+"\n",
			left, left+plotW, y(float64(r.ModelBytes)), y(float64(r.ModelBytes)), left+plotW+4, y(float64(r.ModelBytes))+4, netlab.Size(r.ModelBytes))
		if lb := m.LowerBoundSeconds; lb > 0 && lb < maxT {
			fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#999" stroke-dasharray="4 3"/><text x="%.1f" y="%d" fill="#666">lower bound</text>`+"\n",
				x(lb), x(lb), y0+top, y0+top+plotH, x(lb)+3, y0+top+12)
		}
		for i := 0; i <= 4; i++ {
			t := maxT * float64(i) / 4
			b := maxB * float64(i) / 4
			fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%.0f s</text>`+"\n", x(t), y0+top+plotH+18, t)
			fmt.Fprintf(w, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(b)+4, netlab.Size(int64(b)).Human())
		}
		for i, h := range m.Hosts {
			c := colors[i%len(colors)]
			fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="`, c)
			for _, s := range h.Timeline {
				fmt.Fprintf(w, "%.1f,%.1f ", x(s.Seconds), y(float64(s.Bytes)))
			}
			fmt.Fprintln(w, `"/>`)
			fmt.Fprintf(w, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", left+plotW+4, y0+top+30+14*i, c, html.EscapeString(h.Host))
		}
	}
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}
