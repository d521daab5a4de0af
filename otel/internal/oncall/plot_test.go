package oncall

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"golang.org/x/image/font"
	"gonum.org/v1/plot"
	plotfont "gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// A panel is one query's results over the run, one line a series.
type panel struct {
	title, ylabel string
	q             query
	// scale converts the query's unit to the axis's (1000 for ms).
	scale float64
	log   bool
	// single names the series of a query without labels in the legend.
	single string
}

// A figure is the panels of one situation, with every phase shaded and
// its own the most.
type figure struct {
	file, title string
	focus       phase
	panels      []panel
}

var figures = []figure{
	{
		file:  "observability-abuse.png",
		title: "Abuse: a few keys take most of the rejections",
		focus: abuse,
		panels: []panel{
			{title: "Rejections by route and key class", ylabel: "rejections/s", q: qRejections, scale: 1},
			{title: "Distinct keys rejected in the previous whole minute (gauge, a minute late)", ylabel: "keys", q: qRejectedKeys, scale: 1, log: true},
			{title: "Rejections in the last minute per rejected key", ylabel: "rejections/key", q: qPerKey, scale: 1, log: true},
		},
	},
	{
		file:  "observability-misconfigured.png",
		title: "Misconfigured limit: many paying customers rejected a little, on one route",
		focus: misconfigured,
		panels: []panel{
			{title: "Share of the customer class's decisions rejected, by route", ylabel: "% of decisions", q: qCustomerShare, scale: 100},
			{title: "Distinct customers rejected in the previous whole minute, by route (gauge, a minute late)", ylabel: "customers", q: qRejectedCustomers, scale: 1},
			{title: "Rejections by route and key class", ylabel: "rejections/s", q: qRejections, scale: 1},
		},
	},
	{
		file:  "observability-sick.png",
		title: "Sick limiter: store latency rises, then decisions degrade and the breaker opens",
		focus: sick,
		panels: []panel{
			{title: "p99 of the decisions the store made (allowed or rejected, not degraded)", ylabel: "ms", q: qP99, scale: 1000, log: true, single: "p99"},
			{title: "Decisions the fail policy made instead of the store, by cause", ylabel: "decisions/s", q: qDegraded, scale: 1},
			{title: "Circuit breakers not closed, by state", ylabel: "breakers", q: qBreakers, scale: 1},
		},
	},
}

// seriesColors keeps a series' colour the same in every figure.
var seriesColors = map[string]color.Color{
	"/v1/search customer":  color.RGBA{230, 120, 0, 255},
	"/v1/search anonymous": color.RGBA{200, 30, 30, 255},
	"/v1/export customer":  color.RGBA{30, 90, 200, 255},
	"/v1/search":           color.RGBA{230, 120, 0, 255},
	"/v1/export":           color.RGBA{30, 90, 200, 255},
	"all":                  color.Black,
	"p99":                  color.Black,
	"timeout":              color.RGBA{120, 40, 170, 255},
	"breaker_open":         color.RGBA{200, 30, 30, 255},
	"backend_unavailable":  color.RGBA{140, 90, 40, 255},
	"open":                 color.RGBA{200, 30, 30, 255},
	"half_open":            color.RGBA{230, 120, 0, 255},
}

// phaseColors shade the phases; the figure's own phase gets twice the
// alpha.
var phaseColors = [numPhases]color.NRGBA{
	baseline:      {0, 0, 0, 0},
	abuse:         {220, 60, 60, 28},
	misconfigured: {40, 100, 220, 28},
	sick:          {140, 60, 200, 28},
}

// The figure's size: 3 panels, each wide enough to read 300 seconds.
const (
	figWidth  = 11 * vg.Inch
	figHeight = 10 * vg.Inch
	legendW   = 2.1 * vg.Inch
	titleH    = 0.45 * vg.Inch
	figDPI    = 100
)

// render draws fig from results (by query id) into path.
func render(fig figure, results map[string][]series, sched schedule, path string) error {
	c := vgimg.NewWith(vgimg.UseWH(figWidth, figHeight), vgimg.UseDPI(figDPI))
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	titleStyle := textStyle(15)
	titleStyle.XAlign, titleStyle.YAlign = draw.XCenter, draw.YTop
	dc.FillText(titleStyle, vg.Point{X: figWidth / 2, Y: figHeight - 0.12*vg.Inch}, fig.title)

	tiles := draw.Tiles{Rows: len(fig.panels), Cols: 1, PadTop: 0.1 * vg.Inch, PadBottom: 0.1 * vg.Inch, PadLeft: 0.1 * vg.Inch, PadY: 0.25 * vg.Inch}
	plotArea := draw.Crop(dc, 0, -legendW, 0, -titleH)
	legendArea := draw.Crop(dc, figWidth-legendW, 0, 0, -titleH)
	var plots [][]*plot.Plot
	var legends []plot.Legend
	for i, pn := range fig.panels {
		p, l := panelPlot(fig, pn, results[pn.q.id], sched, i == 0)
		plots = append(plots, []*plot.Plot{p})
		legends = append(legends, l)
	}
	canvases := plot.Align(plots, tiles, plotArea)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
		lc := tiles.At(legendArea, 0, i)
		legends[i].Draw(draw.Crop(lc, 0.1*vg.Inch, 0, 0, -0.35*vg.Inch))
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func textStyle(size vg.Length) text.Style {
	return text.Style{Color: color.Black, Font: plotfont.From(plot.DefaultFont, size), Handler: plot.DefaultTextHandler}
}

// panelPlot makes one panel's plot and its legend.
func panelPlot(fig figure, pn panel, ss []series, sched schedule, labels bool) (*plot.Plot, plot.Legend) {
	p := plot.New()
	p.Title.Text = pn.title
	p.Title.TextStyle.Font.Size = 12
	p.X.Label.Text = "time since the run started (s)"
	p.Y.Label.Text = pn.ylabel
	p.X.Min, p.X.Max = 0, sched.secs(sched.end())
	p.X.Tick.Marker = secondTicks{}
	p.Add(plotter.NewGrid())
	p.Add(bands{sched: sched, focus: fig.focus, labels: labels, stages: fig.focus == sick, minutes: pn.q.gauge})

	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	legend.TextStyle.Font.Size = 11
	legend.ThumbnailWidth = 0.35 * vg.Inch

	slices.SortFunc(ss, func(a, b series) int { return cmp.Compare(seriesName(a.Metric), seriesName(b.Metric)) })
	lo, hi := math.Inf(1), math.Inf(-1)
	drawn := 0
	for i, s := range ss {
		name := seriesName(s.Metric)
		if name == "all" && pn.single != "" {
			name = pn.single
		}
		clr, ok := seriesColors[name]
		if !ok {
			clr = plotutil.Color(i)
		}
		var first *plotter.Line
		for _, seg := range segments(s, sched, pn.scale, pn.log) {
			l, err := plotter.NewLine(seg)
			if err != nil {
				continue
			}
			l.Color = clr
			l.Width = 1.6
			p.Add(l)
			if first == nil {
				first = l
			}
			for _, pt := range seg {
				lo, hi = min(lo, pt.Y), max(hi, pt.Y)
			}
		}
		if first != nil {
			legend.Add(name, first)
			drawn++
		}
	}
	if drawn == 0 {
		p.Add(note{text: "no series: " + pn.q.id + " returned nothing"})
		p.Y.Min, p.Y.Max = 0, 1
		if pn.log {
			p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
			p.Y.Min, p.Y.Max = 1, 10
		}
		return p, legend
	}
	if pn.log {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(lo)))
		p.Y.Max = math.Pow(10, math.Ceil(math.Log10(hi*1.01)))
	} else {
		p.Y.Min = 0
		p.Y.Max = max(hi*1.15, 1)
		p.Y.Tick.Marker = plainTicks{}
	}
	return p, legend
}

// segments cuts a series where it has no value (or, on a log axis, no
// positive one), so that a line is not drawn across a gap.
func segments(s series, sched schedule, scale float64, log bool) []plotter.XYs {
	var segs []plotter.XYs
	var cur plotter.XYs
	prev := math.Inf(-1)
	for i, ts := range s.Times {
		v := s.Values[i] * scale
		bad := math.IsNaN(v) || math.IsInf(v, 0) || (log && v <= 0)
		if bad || ts-prev > 1.5 {
			if len(cur) > 0 {
				segs = append(segs, cur)
			}
			cur = nil
		}
		if !bad {
			x := sched.secs(time.UnixMilli(int64(ts * 1000)))
			cur = append(cur, plotter.XY{X: x, Y: v})
			prev = ts
		}
	}
	if len(cur) > 0 {
		segs = append(segs, cur)
	}
	return segs
}

// secondTicks marks every 30s, labelled every minute.
type secondTicks struct{}

func (secondTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for x := math.Ceil(lo/30) * 30; x <= hi; x += 30 {
		label := ""
		if int(x)%60 == 0 {
			label = fmt.Sprintf("%.0f", x)
		}
		ts = append(ts, plot.Tick{Value: x, Label: label})
	}
	return ts
}

// plainTicks are plot's default ticks, labelled without trailing zeros
// ("500", not "500.00").
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', -1, 64)
		}
	}
	return ts
}

// bands shades the phases behind the data, names them at the top of
// the first panel, and marks the sick phase's stages and, on the
// gauge's panels, the whole minutes it reports.
type bands struct {
	sched                   schedule
	focus                   phase
	labels, stages, minutes bool
}

func (b bands) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, _ := plt.Transforms(&c)
	clampX := func(t time.Time) vg.Length {
		x := trX(b.sched.secs(t))
		return min(max(x, c.Min.X), c.Max.X)
	}
	for p := range numPhases {
		x0, x1 := clampX(b.sched.phaseStart(p)), clampX(b.sched.phaseStart(p+1))
		clr := phaseColors[p]
		if p == b.focus {
			clr.A *= 2
		}
		if clr.A > 0 {
			c.FillPolygon(clr, []vg.Point{{X: x0, Y: c.Min.Y}, {X: x1, Y: c.Min.Y}, {X: x1, Y: c.Max.Y}, {X: x0, Y: c.Max.Y}})
		}
		if p > baseline {
			c.StrokeLine2(draw.LineStyle{Color: color.Gray{120}, Width: 0.8}, x0, c.Min.Y, x0, c.Max.Y)
		}
		if b.labels {
			sty := textStyle(10)
			if p == b.focus {
				sty.Font.Weight = font.WeightBold
				sty.Font.Size = 11
			}
			sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
			c.FillText(sty, vg.Point{X: (x0 + x1) / 2, Y: c.Max.Y - 2}, p.String())
		}
	}
	if b.minutes {
		for m := b.sched.abuse.Add(-time.Minute); !m.After(b.sched.end()); m = m.Add(time.Minute) {
			if x := trX(b.sched.secs(m)); x > c.Min.X && x < c.Max.X {
				c.StrokeLine2(draw.LineStyle{Color: color.Gray{150}, Width: 0.6, Dashes: []vg.Length{1, 3}}, x, c.Min.Y, x, c.Max.Y)
			}
		}
	}
	if b.stages {
		// Each stage is named in its middle, written upwards: 20s is
		// too narrow for the words written across.
		short := []string{"sleeps of 5ms", "sleeps of 15ms", "SIGSTOP", "SIGCONT"}
		for i, st := range stages {
			x0, x1 := clampX(b.sched.at(st.from)), clampX(b.sched.at(st.to))
			if i > 0 {
				c.StrokeLine2(draw.LineStyle{Color: color.RGBA{110, 40, 160, 255}, Width: 0.8, Dashes: []vg.Length{3, 2}}, x0, c.Min.Y, x0, c.Max.Y)
			}
			sty := textStyle(8)
			sty.Color = color.RGBA{90, 30, 140, 255}
			sty.Rotation = math.Pi / 2
			sty.XAlign, sty.YAlign = draw.XRight, draw.YCenter
			c.FillText(sty, vg.Point{X: (x0 + x1) / 2, Y: c.Max.Y - 18}, short[i])
		}
	}
}

// note writes a line in the middle of an empty panel.
type note struct{ text string }

func (n note) Plot(c draw.Canvas, _ *plot.Plot) {
	sty := textStyle(11)
	sty.Color = color.Gray{90}
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YCenter
	c.FillText(sty, vg.Point{X: (c.Min.X + c.Max.X) / 2, Y: (c.Min.Y + c.Max.Y) / 2}, n.text)
}
