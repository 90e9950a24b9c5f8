package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// The hand-over section lies between markers of its own.
const (
	handoverBegin = "<!-- bench:handover:begin -->"
	handoverEnd   = "<!-- bench:handover:end -->"
)

// write draws the charts and replaces the marked sections of doc with the
// report: the main one (its chart at svg; empty: performance-concurrency.svg
// beside doc) unless only the hand-over ran, and the hand-over one
// (performance-handover.svg beside doc) if it ran.
func (r *report) write(doc, svg string) error {
	old, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	text := string(old)
	dir := filepath.Dir(doc)
	main := r.opts.mainRuns()
	// Both markers first: a document without them is left alone, charts too.
	if _, err := replaceSection(doc, text, beginMarker, endMarker, ""); main && err != nil {
		return err
	}
	if _, err := replaceSection(doc, text, handoverBegin, handoverEnd, ""); r.handover != nil && err != nil {
		return err
	}
	if _, err := replaceSection(doc, text, lossBegin, lossEnd, ""); r.loss != nil && err != nil {
		return err
	}
	if main {
		if svg == "" {
			svg = filepath.Join(dir, "performance-concurrency.svg")
		}
		if r.chart, err = drawInto(doc, svg, r.drawChart); err != nil {
			return err
		}
		if text, err = replaceSection(doc, text, beginMarker, endMarker, r.text()); err != nil {
			return err
		}
	}
	if r.handover != nil {
		if r.handoverChart, err = drawInto(doc, filepath.Join(dir, "performance-handover.svg"), r.drawHandoverChart); err != nil {
			return err
		}
		if text, err = replaceSection(doc, text, handoverBegin, handoverEnd, r.handoverText()); err != nil {
			return err
		}
	}
	if r.loss != nil {
		if text, err = replaceSection(doc, text, lossBegin, lossEnd, r.lossText()); err != nil {
			return err
		}
	}
	return os.WriteFile(doc, []byte(text), 0o644)
}

// replaceSection replaces what lies between begin and end in text (the
// document doc) with section.
func replaceSection(doc, text, begin, end, section string) (string, error) {
	before, rest, ok := strings.Cut(text, begin)
	_, after, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		return "", fmt.Errorf("%s has no section between %q and %q to rewrite; add the markers where the figures belong", doc, begin, end)
	}
	return before + begin + "\n" + section + end + after, nil
}

// drawInto draws a chart at svg with draw and returns its link from doc.
func drawInto(doc, svg string, draw func(string) error) (string, error) {
	if err := draw(svg); err != nil {
		return "", fmt.Errorf("drawing %s: %w", svg, err)
	}
	rel, err := filepath.Rel(filepath.Dir(doc), svg)
	return filepath.ToSlash(rel), err
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
	return savePlot(p, 9*vg.Inch, 4.5*vg.Inch, path)
}

// savePlot writes p to path, in the format its extension names (svg, or
// png to look at it).
func savePlot(p *plot.Plot, w, h vg.Length, path string) error {
	format := strings.TrimPrefix(filepath.Ext(path), ".")
	wt, err := p.WriterTo(w, h, format)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// drawHandoverChart writes bars of the hand-over latencies, p50 and p99,
// one group per case, between processes and through the CLI.
func (r *report) drawHandoverChart(path string) error {
	h := r.handover
	var names []string
	var p50, p99 plotter.Values
	for _, c := range append(slices.Clone(h.processes), h.cli...) {
		if c.err != nil || len(c.latencies) == 0 {
			continue
		}
		names = append(names, c.name)
		p50 = append(p50, msf(quantile(c.latencies, 0.5)))
		p99 = append(p99, msf(quantile(c.latencies, 0.99)))
	}
	if len(names) == 0 {
		return fmt.Errorf("no hand-over case has figures to draw")
	}
	p := plot.New()
	p.Title.Text = "Hand-over latency between processes, p50 and p99 (the CLI cases: from command to command)"
	p.Y.Label.Text = "ms"
	p.Y.Min = 0
	p.NominalX(names...)
	p.Legend.Top, p.Legend.Left = true, true
	p.Y.Max = 1.3 * max(slices.Max(p50), slices.Max(p99)) // room for the legend
	width := vg.Points(14)
	for i, v := range []struct {
		name   string
		values plotter.Values
	}{{"p50", p50}, {"p99", p99}} {
		bars, err := plotter.NewBarChart(v.values, width)
		if err != nil {
			return err
		}
		bars.LineStyle.Width = 0
		bars.Color = plotutil.Color(i)
		bars.Offset = vg.Length(float64(i)-0.5) * width
		p.Add(bars)
		p.Legend.Add(v.name, bars)
	}
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	return savePlot(p, 10*vg.Inch, 4*vg.Inch, path)
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
