//go:build unix

package sharding

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkNames measures naming the sub-buckets of a key a Prefix rule
// matches, over a backend with slots laid out as the Redis backends lay
// them (redisscript.Slot), with a new key every call, so that the name
// cache never answers: the CPU a stream of new keys under a prefix costs,
// before any round trip. keylen is the key's length: a short key, and
// the longest 9df940a could split. Besides the time per call, it reports
// the time and the process's CPU time (getrusage: on a loaded machine,
// the time a call waits for a core is not its cost) per sub-bucket.
//
//	go test -run '^$' -bench Names -count 6 ./sharding | benchstat -
func BenchmarkNames(b *testing.B) {
	for _, keyLen := range []int{16, 498} {
		for _, n := range []int{2, 6, 16, 32, 64} {
			b.Run("keylen="+strconv.Itoa(keyLen)+"/n="+strconv.Itoa(n), func(b *testing.B) {
				sb, err := New(slotted{}, Prefix(n, "tenant:"))
				if err != nil {
					b.Fatal(err)
				}
				pad := strings.Repeat("x", keyLen-len("tenant:")-8)
				b.ReportAllocs()
				cpu := cpuTime(b)
				i := 0
				for b.Loop() {
					i++
					key := "tenant:" + pad + strconv.Itoa(10_000_000+i)
					if names := sb.namer.names(key, n, true); len(names) != n {
						b.Fatalf("%d names; want %d", len(names), n)
					}
				}
				cpu = cpuTime(b) - cpu
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/sub-bucket")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/sub-bucket")
			})
		}
	}
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
