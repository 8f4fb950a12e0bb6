package chart

import (
	"bytes"
	"encoding/xml"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.svg")

// sample is a chart of both kinds of panel: a linear Y with a reference
// line and a series out of order, and a log Y with a dashed series
// without a legend entry; and an empty panel.
func sample() []byte {
	return SVG("packcache: <both> & more",
		Panel{
			Title: "ratio", XLabel: "size (log)", YLabel: "stored / plain", HLine: 1,
			Series: []Series{
				{Name: "lz4", Color: Color(0), Points: []Point{{1e4, 2}, {1e2, 0.5}, {1e3, 1}}},
				{Name: "zstd", Color: Color(1), Points: []Point{{1e2, 0.25}, {1e4, 1.5}}},
			},
		},
		Panel{
			Title: "speed", XLabel: "size (log)", YLabel: "MB/s (log)", LogY: true,
			Series: []Series{
				{Name: "lz4", Color: Color(0), Points: []Point{{1e2, 1}, {1e3, 10}, {1e4, 100}}},
				{Color: Color(0), Dashed: true, Points: []Point{{1e2, 2}, {1e4, 20}}},
			},
		},
		Panel{Title: "nothing", Empty: "no data (suite not run)"},
	)
}

type svgDoc struct {
	Polylines []struct {
		Stroke string `xml:"stroke,attr"`
		Dash   string `xml:"stroke-dasharray,attr"`
	} `xml:"polyline"`
	Circles []struct {
		CX   float64 `xml:"cx,attr"`
		CY   float64 `xml:"cy,attr"`
		Fill string  `xml:"fill,attr"`
	} `xml:"circle"`
	Rects []struct {
		Y      float64 `xml:"y,attr"`
		Height float64 `xml:"height,attr"`
	} `xml:"rect"`
	Texts []string `xml:"text"`
}

// TestPointsFollowValues checks the geometry: on a linear axis a point's
// height above the axis is proportional to its value, and on a log axis
// (X always, Y when LogY) equal ratios are equal distances.
func TestPointsFollowValues(t *testing.T) {
	var doc svgDoc
	if err := xml.Unmarshal(sample(), &doc); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	if len(doc.Polylines) != 4 || doc.Polylines[3].Dash == "" || doc.Polylines[0].Dash != "" {
		t.Fatalf("want 4 lines, only the last dashed; got %+v", doc.Polylines)
	}
	if len(doc.Circles) != 10 {
		t.Fatalf("got %d points, want 10", len(doc.Circles))
	}
	// The background, then each drawn panel's frame.
	if len(doc.Rects) != 3 {
		t.Fatalf("got %d rects, want 3", len(doc.Rects))
	}
	bottom := doc.Rects[1].Y + doc.Rects[1].Height
	near := func(a, b float64) bool { return math.Abs(a-b) <= 0.15 } // one decimal in the SVG

	// lz4's ratios, drawn in order of size: 0.5, 1, 2.
	lz4 := doc.Circles[0:3]
	for i, want := range []float64{0.5, 1, 2} {
		// Heights relative to the first point's, which stands for 0.5.
		if got := 0.5 * (bottom - lz4[i].CY) / (bottom - lz4[0].CY); !near(got, want) {
			t.Errorf("lz4 point %d is drawn at the height of %.3f, want %v", i, got, want)
		}
	}
	if !near(lz4[1].CX-lz4[0].CX, lz4[2].CX-lz4[1].CX) {
		t.Errorf("sizes 100, 1000, 10000 are not evenly spaced: x %v %v %v", lz4[0].CX, lz4[1].CX, lz4[2].CX)
	}
	zstd := doc.Circles[3:5]
	if got := (bottom - zstd[1].CY) / (bottom - zstd[0].CY); !near(got, 6) {
		t.Errorf("zstd's 1.5 stands %.3f times as high as its 0.25, want 6", got)
	}
	if zstd[0].CX != lz4[0].CX || zstd[1].CX != lz4[2].CX {
		t.Errorf("one size, two x positions: %v %v vs %v %v", zstd[0].CX, zstd[1].CX, lz4[0].CX, lz4[2].CX)
	}
	if lz4[0].Fill == zstd[0].Fill {
		t.Error("two series of one colour")
	}

	speed := doc.Circles[5:8]
	if d1, d2 := speed[0].CY-speed[1].CY, speed[1].CY-speed[2].CY; d1 <= 0 || !near(d1, d2) {
		t.Errorf("speeds 1, 10, 100 on a log axis: steps %v and %v, want equal and upward", d1, d2)
	}

	want := map[string]bool{"packcache: <both> & more": false, "no data (suite not run)": false, "lz4": false, "zstd": false, "1 kB": false}
	legends := 0
	for _, s := range doc.Texts {
		if _, ok := want[s]; ok {
			want[s] = true
		}
		if s == "lz4" {
			legends++
		}
	}
	for s, seen := range want {
		if !seen {
			t.Errorf("no text %q", s)
		}
	}
	if legends != 2 {
		t.Errorf("lz4 has %d legend entries, want 2 (one a panel; the dashed line has none)", legends)
	}
}

// TestGolden pins the whole document: run with -update after a deliberate
// change to the drawing, and look at testdata/golden.svg before committing it.
func TestGolden(t *testing.T) {
	got := sample()
	path := filepath.Join("testdata", "golden.svg")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	g, w := bytes.Split(got, []byte("\n")), bytes.Split(want, []byte("\n"))
	for i := range max(len(g), len(w)) {
		if i >= len(g) || i >= len(w) || !bytes.Equal(g[i], w[i]) {
			t.Fatalf("SVG differs from %s from line %d (go test -update rewrites it):\ngot  %q\nwant %q", path, i+1, at(g, i), at(w, i))
		}
	}
}

func at(lines [][]byte, i int) []byte {
	if i < len(lines) {
		return lines[i]
	}
	return nil
}
