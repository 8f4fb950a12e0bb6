package main

import (
	"maps"
	"os"
	"slices"

	"github.com/packcache/packcache/internal/chart"
)

// writeChart writes two panels side by side: stored size ratio vs document
// size per codec, and Get latency vs document size per codec.
func (e *env) writeChart(path string) error {
	svg := chart.SVG("packcache: "+e.machine,
		chart.Panel{
			Title:  "Stored / plain: chat messages to 2 KB, then documents (sizes)",
			XLabel: "serialized size, bytes (log)", YLabel: "stored / plain", HLine: 1,
			Empty:  "no data (suite not run)",
			Series: byCodec(e.sizeRatios, 1),
		},
		chart.Panel{
			Title:  "Get latency, typed T, median (cost suite)",
			XLabel: "serialized size, bytes (log)", YLabel: "µs per Get (log)", LogY: true,
			Empty:  "no data (suite not run)",
			Series: byCodec(e.getLat, 1e-3),
		},
	)
	return os.WriteFile(path, svg, 0o644)
}

// byCodec makes a series of each codec's points, Y scaled by f, in order
// of codec name, each codec the colour of its place in that order.
func byCodec(m map[string][]chart.Point, f float64) []chart.Series {
	var out []chart.Series
	for i, name := range slices.Sorted(maps.Keys(m)) {
		s := chart.Series{Name: name, Color: chart.Color(i)}
		for _, p := range m[name] {
			s.Points = append(s.Points, chart.Point{X: p.X, Y: p.Y * f})
		}
		out = append(out, s)
	}
	return out
}
