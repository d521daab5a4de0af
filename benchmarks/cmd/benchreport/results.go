package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"golang.org/x/perf/benchfmt"
)

// results is what one results file of benchmarks/peers.sh holds: the run's
// facts (its file configuration lines) and every measured value.
type results struct {
	// facts are the file configuration: commit, dirty, date, go_version,
	// cpu_model, cpus, kernel, redis_server, command, settings, and the
	// goos, goarch, pkg and cpu lines go test prints.
	facts map[string]string
	// gomaxprocs is the -N suffix of the benchmark names ("" for 1).
	gomaxprocs string
	// values holds each benchmark's values by unit as printed (not
	// benchfmt's tidied units): one per -count run.
	values map[sample][]float64
	// levels lists, for each benchmark and each key of its name's
	// key=value parts ("impl", "goroutines"), the values in the order they
	// first appear, which is the order the benchmark runs them in.
	levels map[string]map[string][]string
}

// sample names the values of one unit of one benchmark: its name without
// the GOMAXPROCS suffix ("Redis/keys=10k/goroutines=16/impl=ulule").
type sample struct{ name, unit string }

// parseResults reads a results file in the Go benchmark format.
func parseResults(r io.Reader, fileName string) (*results, error) {
	res := &results{facts: map[string]string{}, values: map[sample][]float64{}, levels: map[string]map[string][]string{}}
	br := benchfmt.NewReader(r, fileName)
	for br.Scan() {
		switch rec := br.Result().(type) {
		case *benchfmt.SyntaxError:
			return nil, rec
		case *benchfmt.Result:
			res.add(rec)
		}
	}
	if err := br.Err(); err != nil {
		return nil, err
	}
	if len(res.values) == 0 {
		return nil, fmt.Errorf("%s: no benchmark results", fileName)
	}
	return res, nil
}

func (res *results) add(r *benchfmt.Result) {
	for _, c := range r.Config {
		if c.File {
			res.facts[c.Key] = string(c.Value)
		}
	}
	base, parts := r.Name.Parts()
	name := string(base)
	for _, p := range parts {
		if p[0] == '-' {
			res.gomaxprocs = string(p)
			continue
		}
		name += string(p)
		if key, value, ok := strings.Cut(string(p[1:]), "="); ok {
			res.addLevel(string(base), key, value)
		}
	}
	for _, v := range r.Values {
		unit, value := v.Unit, v.Value
		if v.OrigUnit != "" {
			unit, value = v.OrigUnit, v.OrigValue
		}
		s := sample{name, unit}
		res.values[s] = append(res.values[s], value)
	}
}

func (res *results) addLevel(bench, key, value string) {
	levels := res.levels[bench]
	if levels == nil {
		levels = map[string][]string{}
		res.levels[bench] = levels
	}
	if !slices.Contains(levels[key], value) {
		levels[key] = append(levels[key], value)
	}
}

// median returns the median of the values of unit of the benchmark named
// by the parts, joined with slashes ("Redis", "keys=10k", ...), and
// whether there are any.
func (res *results) median(unit string, parts ...string) (float64, bool) {
	vs := slices.Clone(res.values[sample{strings.Join(parts, "/"), unit}])
	if len(vs) == 0 {
		return 0, false
	}
	slices.Sort(vs)
	if n := len(vs); n%2 == 0 {
		return (vs[n/2-1] + vs[n/2]) / 2, true
	}
	return vs[len(vs)/2], true
}

// dirty reports whether the run was made on a tree with uncommitted
// changes, or does not say.
func (res *results) dirty() bool { return res.facts["dirty"] != "false" }
