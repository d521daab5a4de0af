// Package distributed holds sluice's distributed-truth tests: separate OS
// processes of servers's instance program, each with many goroutines, share
// one bucket through a real Redis (a standalone server or a 3-master
// cluster). The tests check that the count admitted is exactly what the
// bucket allows over the run's span of server time, that the recorded
// histories are linearizable (porcupine, against a sequential model of the
// bucket), that a deliberately non-atomic limiter is caught, and that a
// paused cluster master or a killed process admits nothing beyond the limit.
//
// The permit runs (permits_test.go) do the same for concurrency permits:
// the processes' goroutines acquire, hold and release one key's permits,
// and no more than the limit may be held at once, by porcupine against a
// sequential model of the permits (permitModel) and by a count of
// overlapping holds on a redis-server of its own; a killed process's
// permits must come back within their lease and not before it ends, and a
// paused store must lose no permit held and leak none.
//
// It has no code of its own: the runs, the counts and their bounds are
// internal/test/harness's, which the sluice-verify command shares. Run it with
// make test-distributed. The results are in docs/correctness.md.
package distributed
