package bench

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
)

// plotColors tell the strategies apart (colour-blind safe, Okabe-Ito).
var plotColors = [...]string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9"}

// WriteSVG draws one TTFT CDF panel per workload, a line per strategy, on a
// logarithmic time axis (TTFTs span milliseconds to tens of seconds). Plain
// SVG, no dependencies.
func WriteSVG(w io.Writer, r *Results) error {
	const (
		panelW, panelH = 420.0, 260.0
		left, top      = 56.0, 34.0
		plotW, plotH   = panelW - left - 16, panelH - top - 44
		cols           = 2
	)
	var panels []*WorkloadResult
	for i := range r.Workloads {
		if len(r.Workloads[i].Strategies) > 0 {
			panels = append(panels, &r.Workloads[i])
		}
	}
	rows := max(1, (len(panels)+cols-1)/cols)
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n",
		panelW*cols, panelH*float64(rows)+24)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(bw, `<text x="8" y="16" font-size="13">TTFT CDF (simulated seconds, log scale): %d backends, offered load %.2f</text>`+"\n",
		r.Options.Backends, r.Options.Load)
	for p, wr := range panels {
		ox, oy := float64(p%cols)*panelW, 24+float64(p/cols)*panelH
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range wr.Strategies {
			for _, t := range s.TTFTs {
				if t > 0 {
					lo, hi = min(lo, t), max(hi, t)
				}
			}
		}
		if math.IsInf(lo, 0) {
			lo, hi = 1e-3, 1
		}
		// Whole decades around the data.
		dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if dhi <= dlo {
			dhi = dlo + 1
		}
		x := func(t float64) float64 {
			l := math.Log10(max(t, math.Pow(10, dlo))) // zero TTFTs sit on the left edge
			return ox + left + (l-dlo)/(dhi-dlo)*plotW
		}
		y := func(f float64) float64 { return oy + top + (1-f)*plotH }
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" font-size="12" font-weight="bold">%s</text>`+"\n", ox+left, oy+top-14, html.EscapeString(wr.Name))
		fmt.Fprintf(bw, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", ox+left, oy+top, plotW, plotH)
		for d := dlo; d <= dhi; d++ {
			fmt.Fprintf(bw, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x(math.Pow(10, d)), y(0), x(math.Pow(10, d)), y(1))
			fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(math.Pow(10, d)), y(0)+14, seconds(math.Pow(10, d)))
		}
		for _, f := range []float64{0, 0.5, 0.9, 1} {
			fmt.Fprintf(bw, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", ox+left, y(f), ox+left+plotW, y(f))
			fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="end">%.1f</text>`+"\n", ox+left-4, y(f)+4, f)
		}
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="middle">TTFT</text>`+"\n", ox+left+plotW/2, y(0)+28)
		for si, s := range wr.Strategies {
			color := plotColors[si%len(plotColors)]
			ts := slices.Clone(s.TTFTs)
			slices.Sort(ts)
			if len(ts) > 0 {
				fmt.Fprintf(bw, `<path fill="none" stroke="%s" stroke-width="1.6" d="`, color)
				// A step per sample would be thousands of points; 400 evenly
				// spaced quantiles draw the same curve.
				steps := min(len(ts), 400)
				for k := 0; k <= steps; k++ {
					f := float64(k) / float64(steps)
					i := min(len(ts)-1, int(f*float64(len(ts)-1)))
					cmd := "L"
					if k == 0 {
						cmd = "M"
					}
					fmt.Fprintf(bw, "%s%.1f %.1f ", cmd, x(ts[i]), y(f))
				}
				fmt.Fprint(bw, `"/>`+"\n")
			}
			ly := oy + top + 12 + float64(si)*13
			fmt.Fprintf(bw, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`+"\n", ox+left+plotW-128, ly-4, ox+left+plotW-112, ly-4, color)
			fmt.Fprintf(bw, `<text x="%.1f" y="%.1f">%s p50 %s</text>`+"\n", ox+left+plotW-108, ly, html.EscapeString(string(s.Strategy)), seconds(s.TTFTp50))
		}
	}
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

// seconds formats a duration in seconds compactly for axis labels.
func seconds(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%gs", math.Round(s*100)/100)
	case s >= 1e-3:
		return fmt.Sprintf("%gms", math.Round(s*1e5)/100)
	default:
		return fmt.Sprintf("%gus", math.Round(s*1e8)/100)
	}
}
