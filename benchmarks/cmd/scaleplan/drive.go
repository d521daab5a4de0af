package main

import (
	"sync"
	"sync/atomic"
	"time"
)

// drive calls f(0), ..., f(n-1) from g goroutines, each taking the next i,
// and returns how long that took. At the first error the goroutines stop,
// and drive returns it.
func drive(n, g int, f func(i int) error) (time.Duration, error) {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		firstErr error
		once     sync.Once
	)
	start := time.Now()
	for range g {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { firstErr = err })
					next.Store(int64(n)) // the others stop before their next call
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), firstErr
}
