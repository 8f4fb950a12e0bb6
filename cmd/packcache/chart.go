package main

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/packcache/packcache/codec"
)

// The chart follows packbench's (bench/cmd/packbench/chart.go): white
// background, log-scale size axis, one colour per codec, legend on the
// right.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

type point struct{ x, y float64 }

type series struct {
	name   string
	color  string
	dashed bool
	pts    []point
}

type panel struct {
	title, ylabel string
	logY          bool
	hline         float64 // a dashed reference line when > 0
	series        []series
}

// writeAdviceChart writes advise's measurements as an SVG: the stored/plain
// ratio, and the decode and encode speeds, of each codec against value
// size, averaged over the sampled values of each power-of-two size class.
func writeAdviceChart(path string, rep *adviceReport) error {
	ratio := panel{title: "Stored / plain, by value size", ylabel: "stored / plain", hline: 1}
	speed := panel{title: "Speed: decode (solid), encode (dashed)", ylabel: "MB/s (log)", logY: true}
	i := 0
	for _, r := range rep.Results {
		if r.choice.c.ID() == codec.HeaderNone {
			continue
		}
		col := palette[i%len(palette)]
		i++
		rs, ds, es := series{name: r.Codec, color: col}, series{name: r.Codec, color: col}, series{color: col, dashed: true}
		for _, b := range bucketsOf(r.vals) {
			x := math.Sqrt(float64(b.minSize) * float64(b.maxSize)) // geometric middle of the class
			rs.pts = append(rs.pts, point{x, float64(b.comp) / float64(b.plain)})
			if b.dec > 0 {
				ds.pts = append(ds.pts, point{x, float64(b.size) / b.dec * 1e3})
				es.pts = append(es.pts, point{x, float64(b.size) / b.enc * 1e3})
			}
		}
		ratio.series = append(ratio.series, rs)
		speed.series = append(speed.series, ds, es)
	}
	const w, h = 1200, 520
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&sb, `<text x="%d" y="22" font-size="15" text-anchor="middle">packcache advise --prefix %s (%d sampled values of %s keys)</text>`+"\n", w/2, esc(rep.Prefix), rep.Measured, count(rep.Keys))
	drawPanel(&sb, 0, 30, w/2, h-30, ratio)
	drawPanel(&sb, w/2, 30, w/2, h-30, speed)
	sb.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

type sizeClass struct {
	minSize, maxSize  int
	size, comp, plain int
	enc, dec          float64
}

// bucketsOf sums a codec's results by power-of-two size class, smallest
// first.
func bucketsOf(vals []one) []sizeClass {
	by := map[int]*sizeClass{}
	for _, v := range vals {
		b := bucket(v.size)
		c := by[b]
		if c == nil {
			c = &sizeClass{minSize: v.size, maxSize: v.size}
			by[b] = c
		}
		c.minSize, c.maxSize = min(c.minSize, v.size), max(c.maxSize, v.size)
		c.size += v.size
		c.comp += v.comp
		c.plain += v.plain
		c.enc += v.enc
		c.dec += v.dec
	}
	var out []sizeClass
	for _, c := range by {
		if c.minSize > 0 {
			out = append(out, *c)
		}
	}
	slices.SortFunc(out, func(a, b sizeClass) int { return a.minSize - b.minSize })
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
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range p.series {
		for _, q := range s.pts {
			minX, maxX = min(minX, q.x), max(maxX, q.x)
			minY, maxY = min(minY, q.y), max(maxY, q.y)
		}
	}
	if math.IsInf(minX, 1) {
		fmt.Fprintf(sb, `<text x="%d" y="%d" text-anchor="middle" fill="#888">no data</text>`+"\n", x0+ml+int(pw)/2, y0+mt+int(ph)/2)
		return
	}
	if p.hline > 0 {
		minY, maxY = min(minY, p.hline), max(maxY, p.hline)
	}
	lx0, lx1 := math.Floor(math.Log10(minX)), math.Ceil(math.Log10(maxX))
	if lx1 == lx0 {
		lx1++
	}
	tx := func(x float64) float64 { return ox + (math.Log10(x)-lx0)/(lx1-lx0)*pw }
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
	if p.hline > 0 {
		y := ty(p.hline)
		fmt.Fprintf(sb, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#000" stroke-dasharray="4 3"/>`+"\n", ox, y, ox+pw, y)
	}
	fmt.Fprintf(sb, `<text x="%.0f" y="%.0f" text-anchor="middle">value size, decoded (log)</text>`+"\n", ox+pw/2, oy+ph+36)
	fmt.Fprintf(sb, `<text transform="translate(%.0f %.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", ox-50, oy+ph/2, esc(p.ylabel))
	legend := 0
	for _, s := range p.series {
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="5 3"`
		}
		var pts []string
		for _, q := range s.pts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", tx(q.x), ty(q.y)))
		}
		fmt.Fprintf(sb, `<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>`+"\n", s.color, dash, strings.Join(pts, " "))
		for _, q := range s.pts {
			fmt.Fprintf(sb, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`+"\n", tx(q.x), ty(q.y), s.color)
		}
		if s.name == "" {
			continue
		}
		ly := oy + 10 + float64(legend)*18
		legend++
		fmt.Fprintf(sb, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/>`+"\n", ox+pw+10, ly, ox+pw+30, ly, s.color)
		fmt.Fprintf(sb, `<text x="%.0f" y="%.0f">%s</text>`+"\n", ox+pw+35, ly+4, esc(s.name))
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
	s := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
	if s == "" || s == "-" {
		return "0"
	}
	return s
}
