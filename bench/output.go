package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The document's generated section lies between these markers; the rest
// of the document is left as it is.
const (
	beginMarker = "<!-- bench:begin -->"
	endMarker   = "<!-- bench:end -->"
)

// write draws the chart at svg (empty: performance-concurrency.svg beside
// doc) and replaces the marked section of doc with the report.
func (r *report) write(doc, svg string) error {
	old, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	before, rest, ok := strings.Cut(string(old), beginMarker)
	_, after, ok2 := strings.Cut(rest, endMarker)
	if !ok || !ok2 {
		return fmt.Errorf("%s has no section between %q and %q to rewrite; add the markers where the figures belong", doc, beginMarker, endMarker)
	}
	if svg == "" {
		svg = filepath.Join(filepath.Dir(doc), "performance-concurrency.svg")
	}
	if err := r.drawChart(svg); err != nil {
		return fmt.Errorf("drawing %s: %w", svg, err)
	}
	if r.chart, err = filepath.Rel(filepath.Dir(doc), svg); err != nil {
		return err
	}
	r.chart = filepath.ToSlash(r.chart)
	text := before + beginMarker + "\n" + r.text() + endMarker + after
	return os.WriteFile(doc, []byte(text), 0o644)
}

// drawChart writes grouped bars of the median cycles per second: one group
// per scenario, one bar per contender.
func (r *report) drawChart(path string) error {
	p := plot.New()
	p.Title.Text = "Acquire+release cycles per second (median of the rounds)"
	p.Y.Label.Text = "cycles/s"
	p.Y.Min = 0
	var names []string
	for _, s := range r.scenarios {
		names = append(names, s.scenario.name)
	}
	p.NominalX(names...)
	p.Legend.Top = true
	p.Legend.Left = true

	order := contenderNames()
	width := vg.Points(14)
	var drawn int
	var top float64
	for i, name := range order {
		values := make(plotter.Values, len(r.scenarios))
		any := false
		for j, s := range r.scenarios {
			if res := s.find(name); res != nil {
				values[j] = median(res.rates)
				top = max(top, values[j])
				any = true
			}
		}
		if !any {
			continue
		}
		bars, err := plotter.NewBarChart(values, width)
		if err != nil {
			return err
		}
		bars.LineStyle.Width = 0
		bars.Color = plotutil.Color(i)
		bars.Offset = vg.Length(float64(i)-float64(len(order)-1)/2) * width // centred on the tick
		p.Add(bars)
		p.Legend.Add(name, bars)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("no contender has figures to draw")
	}
	// Room above the bars for the legend, and beside the outer groups.
	p.Y.Max = top * 1.5
	p.Y.Tick.Marker = thousands{}
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	format := strings.TrimPrefix(filepath.Ext(path), ".") // svg, or png to look at it
	w, err := p.WriterTo(9*vg.Inch, 4.5*vg.Inch, format)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// thousands marks the axis as the tables write numbers: 12,500.
type thousands struct{}

func (thousands) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = count(int(t.Value))
		}
	}
	return ticks
}
