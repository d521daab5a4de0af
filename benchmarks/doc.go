// Package benchmarks compares sluice's in-memory limiter with the ways Go
// services limit per key today, in one run on one machine, so that the
// results are ratios rather than absolute numbers from different places.
//
// It is a separate module so that the peers it imports stay out of the
// SDK's go.mod. Run it with
//
//	go test -run='^$' -bench=. -benchmem -count=6 -cpu=1,2 ./...
//
// and compare the implementations with
//
//	benchstat -col '/impl@(xrate sluice sethvargo ulule throttled)' results.txt
//
// docs/benchmarks.md in the SDK explains the cases and records results.
package benchmarks
