//go:build !unix

package measure

import "time"

// ProcessCPU is 0 where getrusage is missing: a client CPU figure then
// reads 0.
func ProcessCPU() time.Duration { return 0 }
