// Package chart draws the SVG line charts of packbench and packcache
// advise: a title across the top and panels side by side, each with a
// log-scale size axis, one line per series and a legend on the right.
package chart

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Width and Height are the size of every chart, in pixels.
const Width, Height = 1200, 520

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// Color returns the i'th colour of the palette, which repeats after ten.
func Color(i int) string { return palette[i%len(palette)] }

// A Point is one measurement: X a size in bytes (drawn on a log scale),
// Y the value measured.
type Point struct{ X, Y float64 }

// A Series is one line of a panel. Its points are drawn in order of X.
type Series struct {
	Name   string // its legend entry; a series without a name has none
	Color  string // an SVG colour, such as Color(i)
	Dashed bool
	Points []Point
}

// A Panel is one plot. X is always a size in bytes on a log scale,
// labelled at the powers of ten; Y is linear from zero, or logarithmic.
type Panel struct {
	Title, XLabel, YLabel string
	LogY                  bool
	HLine                 float64 // a dashed reference line at this Y, when > 0
	Empty                 string  // shown when no series has a point; "no data" if empty
	Series                []Series
}

// SVG returns an SVG document of Width by Height on a white background:
// title centred at the top, then panels side by side, each an equal share
// of the width.
func SVG(title string, panels ...Panel) []byte {
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", Width, Height, Width, Height)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", Width, Height)
	fmt.Fprintf(&sb, `<text x="%d" y="22" font-size="15" text-anchor="middle">%s</text>`+"\n", Width/2, esc(title))
	for i, p := range panels {
		w := Width / len(panels)
		drawPanel(&sb, i*w, 30, w, Height-30, p)
	}
	sb.WriteString("</svg>\n")
	return []byte(sb.String())
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// drawPanel draws p in the box of width w and height h whose top left
// corner is (x0, y0).
func drawPanel(sb *strings.Builder, x0, y0, w, h int, p Panel) {
	const ml, mr, mt, mb = 70, 150, 30, 50
	pw, ph := float64(w-ml-mr), float64(h-mt-mb)
	ox, oy := float64(x0+ml), float64(y0+mt)
	fmt.Fprintf(sb, `<text x="%d" y="%d" font-size="13" text-anchor="middle" font-weight="bold">%s</text>`+"\n", x0+ml+int(pw)/2, y0+18, esc(p.Title))
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		for _, q := range s.Points {
			minX, maxX = min(minX, q.X), max(maxX, q.X)
			minY, maxY = min(minY, q.Y), max(maxY, q.Y)
		}
	}
	if math.IsInf(minX, 1) {
		empty := cmp.Or(p.Empty, "no data")
		fmt.Fprintf(sb, `<text x="%d" y="%d" text-anchor="middle" fill="#888">%s</text>`+"\n", x0+ml+int(pw)/2, y0+mt+int(ph)/2, esc(empty))
		return
	}
	if p.HLine > 0 {
		minY, maxY = min(minY, p.HLine), max(maxY, p.HLine)
	}
	// Both log axes span whole decades, at least one.
	lx0, lx1 := math.Floor(math.Log10(minX)), math.Ceil(math.Log10(maxX))
	if lx1 == lx0 {
		lx1++
	}
	tx := func(x float64) float64 { return ox + (math.Log10(x)-lx0)/(lx1-lx0)*pw }
	var ty func(float64) float64
	var yticks []float64
	if p.LogY {
		ly0, ly1 := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
		if ly1 == ly0 {
			ly1++
		}
		ty = func(y float64) float64 { return oy + ph - (math.Log10(y)-ly0)/(ly1-ly0)*ph }
		for l := ly0; l <= ly1; l++ {
			yticks = append(yticks, math.Pow(10, l))
		}
	} else {
		top := math.Ceil(maxY*10) / 10
		ty = func(y float64) float64 { return oy + ph - y/top*ph }
		step := niceStep(top / 6)
		for v := 0.0; v <= top+1e-9; v += step {
			yticks = append(yticks, v)
		}
	}
	fmt.Fprintf(sb, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", ox, oy, pw, ph)
	for l := lx0; l <= lx1; l++ {
		x := tx(math.Pow(10, l))
		fmt.Fprintf(sb, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", x, oy, x, oy+ph)
		fmt.Fprintf(sb, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x, oy+ph+16, decimalSize(math.Pow(10, l)))
	}
	for _, v := range yticks {
		y := ty(v)
		fmt.Fprintf(sb, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", ox, y, ox+pw, y)
		fmt.Fprintf(sb, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", ox-5, y+4, trimFloat(v))
	}
	if p.HLine > 0 {
		y := ty(p.HLine)
		fmt.Fprintf(sb, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#000" stroke-dasharray="4 3"/>`+"\n", ox, y, ox+pw, y)
	}
	fmt.Fprintf(sb, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", ox+pw/2, oy+ph+36, esc(p.XLabel))
	fmt.Fprintf(sb, `<text transform="translate(%.0f %.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", ox-50, oy+ph/2, esc(p.YLabel))
	legend := 0
	for _, s := range p.Series {
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="5 3"`
		}
		ps := slices.Clone(s.Points)
		slices.SortStableFunc(ps, func(a, b Point) int { return cmp.Compare(a.X, b.X) })
		var pts []string
		for _, q := range ps {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", tx(q.X), ty(q.Y)))
		}
		fmt.Fprintf(sb, `<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>`+"\n", s.Color, dash, strings.Join(pts, " "))
		for _, q := range ps {
			fmt.Fprintf(sb, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`+"\n", tx(q.X), ty(q.Y), s.Color)
		}
		if s.Name == "" {
			continue
		}
		ly := oy + 10 + float64(legend)*18
		legend++
		fmt.Fprintf(sb, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/>`+"\n", ox+pw+10, ly, ox+pw+30, ly, s.Color)
		fmt.Fprintf(sb, `<text x="%.0f" y="%.0f">%s</text>`+"\n", ox+pw+35, ly+4, esc(s.Name))
	}
}

// decimalSize labels a power of ten: "100 B", "10 kB", "1 MB".
func decimalSize(v float64) string {
	switch {
	case v >= 1e6:
		return trimFloat(v/1e6) + " MB"
	case v >= 1e3:
		return trimFloat(v/1e3) + " kB"
	}
	return trimFloat(v) + " B"
}

// niceStep rounds raw up to 1, 2, 2.5 or 5 times a power of ten.
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

// trimFloat prints v with at most two decimals and no trailing zeros.
func trimFloat(v float64) string {
	s := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
	if s == "" || s == "-" {
		return "0"
	}
	return s
}
