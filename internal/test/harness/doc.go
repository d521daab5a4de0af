// Package harness runs sluice's distributed-truth checks: separate OS
// processes (instances), each with many goroutines, make calls on one
// bucket through a real Redis, report every call, and the harness adds up
// what they were admitted against the exact bound the bucket allows over
// the run's span of server time.
//
// It is one implementation for three users: the tests of
// internal/test/distributed, which start the instance program of
// internal/test/servers; the sluice-verify command, which starts itself as
// its instances; and testkit's CheckInstances, which starts the user's own
// test binary as its instances, deciding with the user's own backend.
// [Start] runs the instances of a [Spec]; [Measure] makes an admission
// [Run] and returns its [Result], whose Check compares the count with the
// [Bounds]; [Buckets] are the buckets all three check; a [Report] is what
// sluice-verify prints and the kit fails a test with; [Keys] and [Clean]
// find and remove the keys a run made under its prefix.
//
// An instance is any program that calls [InstanceMain] when [IsInstance]
// says so, with the [Connector] that builds its backend ([Connect] for
// sluice's own): it reads its Spec on stdin, connects and, released by the
// harness, writes a [Line] for each call, after [LinePrefix] on stdout.
// Spec.Holds divide a run into phases so that a caller can strike a fault
// at a point the calls cannot run past.
//
// A run may hold concurrency permits instead ([Spec].Permits): each
// goroutine is then a client that acquires a permit of one key, holds it
// and releases it, reporting each call with its [PermitCall], and may
// count the permits it holds on an overlap counter of a server of its own;
// [CountPermits] adds up such a run and checks each decision.
package harness
