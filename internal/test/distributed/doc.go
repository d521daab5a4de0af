// Package distributed holds sluice's distributed-truth tests: separate OS
// processes of servers's instance program, each with many goroutines, share
// one bucket through a real Redis (a standalone server or a 3-master
// cluster). The tests check that the count admitted is exactly what the
// bucket allows over the run's span of server time, that the recorded
// histories are linearizable (porcupine, against a sequential model of the
// bucket), that a deliberately non-atomic limiter is caught, and that a
// paused cluster master or a killed process admits nothing beyond the limit.
//
// It has no code of its own: the runs, the counts and their bounds are
// internal/test/harness's, which the sluice-verify command shares. Run it with
// make test-distributed. The results are in docs/correctness.md.
package distributed
