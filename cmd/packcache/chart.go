package main

import (
	"fmt"
	"math"
	"os"
	"slices"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/chart"
)

// writeAdviceChart writes advise's measurements as an SVG: the stored/plain
// ratio, and the decode and encode speeds, of each codec against value
// size, averaged over the sampled values of each power-of-two size class.
func writeAdviceChart(path string, rep *adviceReport) error {
	const xlabel = "value size, decoded (log)"
	ratio := chart.Panel{Title: "Stored / plain, by value size", XLabel: xlabel, YLabel: "stored / plain", HLine: 1}
	speed := chart.Panel{Title: "Speed: decode (solid), encode (dashed)", XLabel: xlabel, YLabel: "MB/s (log)", LogY: true}
	i := 0
	for _, r := range rep.Results {
		if r.choice.c.ID() == codec.HeaderNone {
			continue
		}
		col := chart.Color(i)
		i++
		rs, ds, es := chart.Series{Name: r.Codec, Color: col}, chart.Series{Name: r.Codec, Color: col}, chart.Series{Color: col, Dashed: true}
		for _, b := range bucketsOf(r.vals) {
			x := math.Sqrt(float64(b.minSize) * float64(b.maxSize)) // geometric middle of the class
			rs.Points = append(rs.Points, chart.Point{X: x, Y: float64(b.comp) / float64(b.plain)})
			if b.dec > 0 {
				ds.Points = append(ds.Points, chart.Point{X: x, Y: float64(b.size) / b.dec * 1e3})
				es.Points = append(es.Points, chart.Point{X: x, Y: float64(b.size) / b.enc * 1e3})
			}
		}
		ratio.Series = append(ratio.Series, rs)
		speed.Series = append(speed.Series, ds, es)
	}
	title := fmt.Sprintf("packcache advise --prefix %s (%d sampled values of %s keys)", rep.Prefix, rep.Measured, count(rep.Keys))
	return os.WriteFile(path, chart.SVG(title, ratio, speed), 0o644)
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
