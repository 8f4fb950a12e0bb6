package main

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
)

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

type panel struct {
	title, xlabel, ylabel string
	logY                  bool
	series                map[string][]point
	hline                 float64 // drawn when > 0 (e.g. ratio 1)
}

// writeChart writes two panels side by side: stored size ratio vs document
// size per codec, and Get latency vs document size per codec.
func (e *env) writeChart(path string) error {
	const w, h = 1200, 520
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&sb, `<text x="%d" y="22" font-size="15" text-anchor="middle">packcache: %s</text>`+"\n", w/2, esc(e.machine))
	drawPanel(&sb, 0, 30, w/2, h-30, panel{
		title:  "Stored / plain: chat messages to 2 KB, then documents (sizes)",
		xlabel: "serialized size, bytes (log)", ylabel: "stored / plain",
		series: e.sizeRatios, hline: 1,
	})
	drawPanel(&sb, w/2, 30, w/2, h-30, panel{
		title:  "Get latency, typed T, median (cost suite)",
		xlabel: "serialized size, bytes (log)", ylabel: "µs per Get (log)", logY: true,
		series: scaleY(e.getLat, 1e-3),
	})
	sb.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

func scaleY(m map[string][]point, f float64) map[string][]point {
	out := map[string][]point{}
	for k, ps := range m {
		for _, p := range ps {
			out[k] = append(out[k], point{p.x, p.y * f})
		}
	}
	return out
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

func drawPanel(sb *strings.Builder, x0, y0, w, h int, p panel) {
	const ml, mr, mt, mb = 70, 150, 30, 50
	pw, ph := float64(w-ml-mr), float64(h-mt-mb)
	ox, oy := float64(x0+ml), float64(y0+mt)
	fmt.Fprintf(sb, `<text x="%d" y="%d" font-size="13" text-anchor="middle" font-weight="bold">%s</text>`+"\n", x0+ml+int(pw)/2, y0+18, esc(p.title))
	names := make([]string, 0, len(p.series))
	for k := range p.series {
		names = append(names, k)
	}
	slices.Sort(names)
	if len(names) == 0 {
		fmt.Fprintf(sb, `<text x="%d" y="%d" text-anchor="middle" fill="#888">no data (suite not run)</text>`+"\n", x0+ml+int(pw)/2, y0+mt+int(ph)/2)
		return
	}
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, ps := range p.series {
		for _, q := range ps {
			minX, maxX = math.Min(minX, q.x), math.Max(maxX, q.x)
			minY, maxY = math.Min(minY, q.y), math.Max(maxY, q.y)
		}
	}
	if p.hline > 0 {
		minY, maxY = math.Min(minY, p.hline), math.Max(maxY, p.hline)
	}
	lx0, lx1 := math.Floor(math.Log10(minX)), math.Ceil(math.Log10(maxX))
	if lx1 == lx0 {
		lx1++
	}
	var ty func(float64) float64
	var yticks []float64
	if p.logY {
		ly0, ly1 := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
		if ly1 == ly0 {
			ly1++
		}
		ty = func(y float64) float64 { return oy + ph - (math.Log10(y)-ly0)/(ly1-ly0)*ph }
		for l := ly0; l <= ly1; l++ {
			yticks = append(yticks, math.Pow(10, l))
		}
	} else {
		y0v, y1v := 0.0, math.Ceil(maxY*10)/10
		ty = func(y float64) float64 { return oy + ph - (y-y0v)/(y1v-y0v)*ph }
		step := niceStep(y1v / 6)
		for v := 0.0; v <= y1v+1e-9; v += step {
			yticks = append(yticks, v)
		}
	}
	tx := func(x float64) float64 { return ox + (math.Log10(x)-lx0)/(lx1-lx0)*pw }
	// axes and grid
	fmt.Fprintf(sb, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", ox, oy, pw, ph)
	for l := lx0; l <= lx1; l++ {
		x := tx(math.Pow(10, l))
		fmt.Fprintf(sb, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", x, oy, x, oy+ph)
		fmt.Fprintf(sb, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x, oy+ph+16, human(int(math.Pow(10, l))))
	}
	for _, v := range yticks {
		y := ty(v)
		fmt.Fprintf(sb, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", ox, y, ox+pw, y)
		fmt.Fprintf(sb, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", ox-5, y+4, trimFloat(v))
	}
	if p.hline > 0 {
		y := ty(p.hline)
		fmt.Fprintf(sb, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#000" stroke-dasharray="4 3"/>`+"\n", ox, y, ox+pw, y)
	}
	fmt.Fprintf(sb, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", ox+pw/2, oy+ph+36, esc(p.xlabel))
	fmt.Fprintf(sb, `<text transform="translate(%.0f %.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", ox-50, oy+ph/2, esc(p.ylabel))
	// series
	for i, name := range names {
		ps := slices.Clone(p.series[name])
		slices.SortFunc(ps, func(a, b point) int { return int(math.Copysign(1, a.x-b.x)) })
		col := palette[i%len(palette)]
		var pts []string
		for _, q := range ps {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", tx(q.x), ty(q.y)))
		}
		fmt.Fprintf(sb, `<polyline fill="none" stroke="%s" stroke-width="1.8" points="%s"/>`+"\n", col, strings.Join(pts, " "))
		for _, q := range ps {
			fmt.Fprintf(sb, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`+"\n", tx(q.x), ty(q.y), col)
		}
		ly := oy + 10 + float64(i)*18
		fmt.Fprintf(sb, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/>`+"\n", ox+pw+10, ly, ox+pw+30, ly, col)
		fmt.Fprintf(sb, `<text x="%.0f" y="%.0f">%s</text>`+"\n", ox+pw+35, ly+4, esc(name))
	}
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "" || s == "-" {
		return "0"
	}
	return s
}
