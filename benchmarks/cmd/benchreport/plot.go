package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// percentiles are the latency units the latency plots show, and their
// labels.
var percentiles = []struct{ unit, label string }{
	{"p50-µs", "p50"}, {"p99-µs", "p99"}, {"p99.9-µs", "p99.9"},
}

// A figure is one plot file: its name in the report's template, its file
// name, and how it is drawn.
type figure struct {
	name, file string
	draw       func(res *results, path string) error
}

// figures are the report's plots.
var figures = []figure{
	{"memory_throughput", "bench-memory-throughput.png", func(res *results, path string) error {
		return throughputPlot(res, memoryBench, memoryKeys, "In memory, 100k keys", path)
	}},
	{"memory_latency", "bench-memory-latency.png", func(res *results, path string) error {
		return latencyPlot(res, memoryBench, memoryKeys, "In memory, 100k keys", path)
	}},
	{"redis_throughput", "bench-redis-throughput.png", func(res *results, path string) error {
		return throughputPlot(res, redisBench, redisKeys, "Redis, 10k keys", path)
	}},
	{"redis_latency", "bench-redis-latency.png", func(res *results, path string) error {
		return latencyPlot(res, redisBench, redisKeys, "Redis, 10k keys", path)
	}},
}

// writePlots draws every figure into dir and returns their paths relative
// to relTo by name.
func writePlots(res *results, dir, relTo string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for _, f := range figures {
		path := filepath.Join(dir, f.file)
		if err := f.draw(res, path); err != nil {
			return nil, fmt.Errorf("%s: %w", f.file, err)
		}
		rel, err := filepath.Rel(relTo, path)
		if err != nil {
			return nil, err
		}
		paths[f.name] = filepath.ToSlash(rel)
	}
	return paths, nil
}

// throughputPlot draws decisions/s against goroutines, a line per impl, the
// goroutine counts evenly spaced.
func throughputPlot(res *results, bench, keys, title, path string) error {
	levels := res.levels[bench]
	p := plot.New()
	p.Title.Text = title + ": decisions per second"
	p.X.Label.Text = "goroutines"
	p.Y.Label.Text = "decisions/s"
	p.Y.Min = 0
	p.Y.Tick.Marker = countTicks{}
	p.X.Tick.Marker = labelTicks(levels["goroutines"])
	p.X.Min, p.X.Max = -0.2, float64(len(levels["goroutines"]))-0.8
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for i, impl := range levels["impl"] {
		var xys plotter.XYs
		for x, g := range levels["goroutines"] {
			if v, ok := res.median("decisions/s", bench, "keys="+keys, "goroutines="+g, "impl="+impl); ok {
				xys = append(xys, plotter.XY{X: float64(x), Y: v})
			}
		}
		if err := addLine(p, i, impl, xys); err != nil {
			return err
		}
	}
	// Room above the lines for the legend.
	p.Y.Max *= 1 + legendRoom(levels["impl"])
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// latencyPlot draws, in a panel per goroutine count, the p50, p99 and p99.9
// latency of each impl on a log scale.
func latencyPlot(res *results, bench, keys, title, path string) error {
	levels := res.levels[bench]
	gs := levels["goroutines"]
	const cols = 2
	rows := (len(gs) + cols - 1) / cols
	panels := make([][]*plot.Plot, rows)
	labels := make([]string, len(percentiles))
	for i, pc := range percentiles {
		labels[i] = pc.label
	}
	for n, g := range gs {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: latency, %s", title, goroutinesLabel(g))
		p.Y.Label.Text = "µs (log scale)"
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
		p.X.Tick.Marker = labelTicks(labels)
		p.X.Min, p.X.Max = -0.2, float64(len(labels))-0.8
		p.Legend.Top = true
		p.Legend.Left = true
		p.Add(plotter.NewGrid())
		for i, impl := range levels["impl"] {
			var xys plotter.XYs
			for x, pc := range percentiles {
				if v, ok := res.median(pc.unit, bench, "keys="+keys, "goroutines="+g, "impl="+impl); ok && v > 0 {
					xys = append(xys, plotter.XY{X: float64(x), Y: v})
				}
			}
			if err := addLine(p, i, impl, xys); err != nil {
				return err
			}
		}
		// Room above the lines for the legend, on the log scale.
		p.Y.Max *= math.Pow(p.Y.Max/p.Y.Min, legendRoom(levels["impl"]))
		panels[n/cols] = append(panels[n/cols], p)
	}
	for len(panels[rows-1]) < cols {
		panels[rows-1] = append(panels[rows-1], nil)
	}
	width, height := 12*vg.Inch, vg.Length(rows)*4.5*vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Inch / 4, PadY: vg.Inch / 4,
		PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	canvases := plot.Align(panels, tiles, dc)
	for r, row := range panels {
		for c, p := range row {
			if p != nil {
				p.Draw(canvases[r][c])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// addLine adds the i-th impl's points to p as a line with markers, in the
// i-th of plotutil's colours, shapes and dashes, so that every plot draws
// an impl alike.
func addLine(p *plot.Plot, i int, impl string, xys plotter.XYs) error {
	if len(xys) == 0 {
		return nil
	}
	line, points, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	line.Color = plotutil.Color(i)
	line.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
	line.Width = vg.Points(1.5)
	points.Color = plotutil.Color(i)
	points.Shape = plotutil.Shape(i)
	points.Radius = vg.Points(3)
	p.Add(line, points)
	p.Legend.Add(impl, line, points)
	return nil
}

// legendRoom is the share of a plot's data range to add above it so that a
// legend of impls, in the top left corner, covers no line.
func legendRoom(impls []string) float64 { return 0.08 * float64(len(impls)) }

// countTicks are gonum's default ticks labelled as whole numbers with
// thousands separators.
type countTicks struct{}

// Ticks returns the default ticks within [min, max], relabelled.
func (countTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = formatValue(ticks[i].Value, true, 0)
		}
	}
	return ticks
}

// logTicks label the powers of ten within [min, max] (min > 0), and 2 and 5
// times them too when the axis spans at most three decades: plot.LogTicks
// labels only the powers of ten, so an axis spanning less than a decade
// would get one label or none.
type logTicks struct{}

// Ticks returns the labelled ticks within [min, max].
func (logTicks) Ticks(min, max float64) []plot.Tick {
	mantissas := []float64{1, 2, 5}
	if max/min > 1000 {
		mantissas = mantissas[:1]
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(min)); e <= math.Ceil(math.Log10(max)); e++ {
		for _, m := range mantissas {
			// Dividing by a power of ten that is exact in binary makes
			// 0.2 and 0.05 the doubles nearest them, as multiplying by
			// 10^e would not.
			v := m * math.Pow(10, e)
			if e < 0 {
				v = m / math.Pow(10, -e)
			}
			if v >= min && v <= max {
				ticks = append(ticks, plot.Tick{Value: v, Label: formatTick(v)})
			}
		}
	}
	return ticks
}

// formatTick is v, a 1, 2 or 5 times a power of ten, in the fewest digits.
func formatTick(v float64) string {
	if v >= 1000 {
		return formatValue(v, true, 0)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// labelTicks puts labels[i] at x = i.
type labelTicks []string

// Ticks returns a tick for each label within [min, max].
func (l labelTicks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for i, label := range l {
		if x := float64(i); x >= min && x <= max {
			ticks = append(ticks, plot.Tick{Value: x, Label: label})
		}
	}
	return ticks
}
