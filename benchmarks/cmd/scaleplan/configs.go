package main

import (
	"maps"
	"slices"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// day is the period of the per-user limits of docs/scale.md.
const day = 24 * time.Hour

// configs are the limits a run may decide on (-config), by name.
var configs = map[string]ratelimit.Config{
	// One bandwidth: 1,000 a day, a token every 86.4 s.
	"day1000": {Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(day, 1000)}},
	// The plan's per-user limit: 500 a day, a token every 172.8 s.
	"day500": {Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(day, 500)}},
	// Two bandwidths with IDs: a burst of 20 at 10 a second, and 1,000 a
	// day.
	"burst+day": {Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(10).WithBurst(20).WithID("burst"),
		ratelimit.Every(day, 1000).WithID("daily")}},
	// The plan's two bandwidths: a burst of 20 at 10 a second, and 500 a
	// day.
	"burst+day500": {Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(10).WithBurst(20).WithID("burst"),
		ratelimit.Every(day, 500).WithID("daily")}},
	// A limit no run reaches: a million a second, with a burst of 2^40.
	"hot": {Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6).WithBurst(1 << 40)}},
}

// configNames are the names of configs, sorted.
func configNames() []string { return slices.Sorted(maps.Keys(configs)) }
