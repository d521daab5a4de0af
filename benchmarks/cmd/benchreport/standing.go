package main

import (
	"fmt"
	"strconv"
	"strings"
)

// comparison is one row of the standing table: sluice's implementation
// against a peer's, on a benchmark and key set.
type comparison struct {
	label       string // what the row compares, in Markdown
	bench, keys string
	ours, peer  string // the impl levels
}

// comparisons are the rows of the standing table, for the peers the run
// measured: every in-memory peer against sluice, and redis_rate against
// each of sluice's Redis clients.
func comparisons(res *results) []comparison {
	var rows []comparison
	for _, keys := range []struct{ level, name string }{{memoryKeys, "100,000 keys"}, {hotKey, "one hot key"}} {
		for _, peer := range res.levels[memoryBench]["impl"] {
			if peer == "sluice" {
				continue
			}
			rows = append(rows, comparison{"in memory, " + keys.name + ": `sluice` ÷ `" + peer + "`", memoryBench, keys.level, "sluice", peer})
		}
	}
	for _, keys := range []struct{ level, name string }{{redisKeys, "10,000 keys"}, {hotKey, "one hot key"}} {
		for _, ours := range []string{"sluice-goredis", "sluice-rueidis"} {
			rows = append(rows, comparison{"Redis, " + keys.name + ": `" + ours + "` ÷ `redis_rate`", redisBench, keys.level, ours, "redis_rate"})
		}
	}
	return rows
}

// ratio is ours' decisions/s over peer's in one benchmark, and whether the
// run has both.
func ratio(res *results, c comparison, goroutines string) (float64, bool) {
	at := func(impl string) (float64, bool) {
		return res.median("decisions/s", c.bench, "keys="+c.keys, "goroutines="+goroutines, "impl="+impl)
	}
	ours, ok1 := at(c.ours)
	peer, ok2 := at(c.peer)
	if !ok1 || !ok2 || peer == 0 {
		return 0, false
	}
	return ours / peer, true
}

// formatRatio is r to two decimals and a ×, bold when below 1 (sluice
// behind).
func formatRatio(r float64) string {
	s := strconv.FormatFloat(r, 'f', 2, 64) + "×"
	if r < 1 {
		return "**" + s + "**"
	}
	return s
}

// standingTable is the ratio of sluice's decisions/s to each peer's, a row
// per comparison and a column per goroutine count, then the pipelined
// ceiling's; behind counts the ratios below 1, of all it shows.
func standingTable(res *results) (table string, behind, all int) {
	counts := res.levels[memoryBench]["goroutines"]
	header := []string{"sluice's decisions/s ÷ the peer's"}
	for _, g := range counts {
		header = append(header, goroutinesLabel(g))
	}
	var rows [][]string
	for _, c := range comparisons(res) {
		row := []string{c.label}
		for _, g := range counts {
			r, ok := ratio(res, c, g)
			if !ok {
				row = append(row, noValue)
				continue
			}
			row = append(row, formatRatio(r))
			if all++; r < 1 {
				behind++
			}
		}
		rows = append(rows, row)
	}
	table = markdownTable(header, rows)
	if tail, b, n := tailTable(res, counts); n > 0 {
		table += "\n\nThe slowest calls in memory on 100,000 keys: the lowest p99.9 latency of any peer (named) divided by sluice's, so that above 1 sluice's slowest one in a thousand calls take less time:\n\n" + tail
		behind, all = behind+b, all+n
	}
	var ceilings []string
	for _, keys := range res.levels[ceilingBench]["keys"] {
		parts := func(impl string) []string { return []string{ceilingBench, "keys=" + keys, "impl=" + impl} }
		ours, ok1 := res.median("requests/s", parts("sluice")...)
		peer, ok2 := res.median("requests/s", parts("redis_rate")...)
		if !ok1 || !ok2 || peer == 0 {
			continue
		}
		r := ours / peer
		name := keys + " keys"
		if keys == "1" {
			name = "one key"
		}
		ceilings = append(ceilings, fmt.Sprintf("%s on %s", formatRatio(r), name))
		if all++; r < 1 {
			behind++
		}
	}
	if len(ceilings) > 0 {
		table += "\n\nThe pipelined ceiling of one redis-server (its work alone, not the client's), sluice's over redis_rate's: " + strings.Join(ceilings, ", ") + "."
	}
	return table, behind, all
}

// tailTable compares the slowest calls in memory on many keys: at each
// goroutine count, the lowest p99.9 latency of any peer (median of the
// runs) over sluice's, so that above 1 sluice's slowest calls are the
// faster; behind counts the ratios below 1, of all it shows.
func tailTable(res *results, counts []string) (table string, behind, all int) {
	header := []string{"the lowest peer p99.9 ÷ sluice's"}
	row := []string{"in memory, 100,000 keys: p99.9 latency of one call"}
	for _, g := range counts {
		at := func(impl string) (float64, bool) {
			return res.median("p99.9-µs", memoryBench, "keys="+memoryKeys, "goroutines="+g, "impl="+impl)
		}
		ours, ok := at("sluice")
		best, bestPeer := 0.0, ""
		for _, peer := range res.levels[memoryBench]["impl"] {
			if v, ok := at(peer); ok && peer != "sluice" && (bestPeer == "" || v < best) {
				best, bestPeer = v, peer
			}
		}
		if !ok || ours == 0 || bestPeer == "" {
			row = append(row, noValue)
			continue
		}
		r := best / ours
		row = append(row, formatRatio(r)+" (`"+bestPeer+"`)")
		if all++; r < 1 {
			behind++
		}
	}
	if all == 0 {
		return "", 0, 0
	}
	for _, g := range counts {
		header = append(header, goroutinesLabel(g))
	}
	return markdownTable(header, [][]string{row}), behind, all
}
