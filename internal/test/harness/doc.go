// Package harness runs sluice's distributed-truth checks: separate OS
// processes (instances), each with many goroutines, make calls on one
// bucket through a real Redis, report every call, and the harness adds up
// what they were admitted against the exact bound the bucket allows over
// the run's span of server time.
//
// It is one implementation for two users: the tests of
// internal/test/distributed, which start the instance program of
// internal/test/servers, and the sluice-verify command, which starts itself
// as its instances. [Start] runs the instances of a [Spec]; [Measure] makes
// an admission [Run] and returns its [Result], whose Check compares the
// count with the [Bounds]; [Buckets] are the buckets both check; [Keys]
// and [Clean] find and remove the keys a run made under its prefix.
//
// An instance is any program that calls [InstanceMain] when [IsInstance]
// says so: it reads its Spec on stdin, connects ([Connect]) and, released
// by the harness, writes a [Line] for each call. Spec.Holds divide a run
// into phases so that a caller can strike a fault at a point the calls
// cannot run past.
package harness
