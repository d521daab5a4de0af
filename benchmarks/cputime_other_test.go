//go:build !unix

package benchmarks

import "time"

// processCPU is 0 where getrusage is missing: client-µs/op then reads 0.
func processCPU() time.Duration { return 0 }
