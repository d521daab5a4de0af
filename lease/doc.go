// Package lease decides hot keys at memory speed without ever going over
// their limit: an instance takes a batch of a key's tokens from the shared
// bucket in one atomic call (a ConsumeUpTo), and spends them in memory.
// The shared bucket is charged before any request is admitted.
//
//	backend, err := ratelimit.Stack(redisBackend,
//		lease.Layer(lease.Keys("global"), lease.WithTarget(20*time.Millisecond)),
//	)
//
// Keys no rule matches, and every call but a Consume, pass through. A
// Consume of more tokens than the largest lease goes to the store too.
// Permit calls ([Backend.DoPermit]) pass through untouched, on any key:
// leases are for rates, and a concurrency limit is held in the store.
//
// # The lease
//
// Per key and instance, a lease holds the tokens of the last refills (at
// most two, the older spent first). A Consume that finds enough takes
// them under the lease's lock and returns; when what is left falls to
// half the last refill, one refill is sent ahead of need. A Consume that
// finds too few waits for the refill in flight, or sends one, which gives
// it its tokens first when it lands: one store call per key and instance
// is in flight at a time.
//
// A refill asks for the tokens this instance was asked for in the last
// [WithTarget] (default 20ms) at the rate it has seen, at least what the
// waiting call needs, at most twice what the last refill asked for (so
// that instances starting at once, or a key just turned hot, do not each
// take a share of the capacity before their rates are known), and at most
// [WithMaxShare] of the smallest capacity (default 10%), so that a quiet
// key does not hoard tokens the other instances need. The refill runs on
// after its caller has gone ([WithRefillTimeout]); a caller that gives up
// gets its context's error, and the tokens stay in the lease.
//
// A refill that gets fewer tokens than it asked for has found the bucket
// running dry. Until the bucket could have refilled what it missed (or,
// if it got none, until the time the store said its next token comes), a
// call the lease cannot cover is denied without a store call, and no
// refill goes out ahead of need. Above the limit, the instances then take
// the bucket's tokens in batches rather than one or two a call.
//
// # The bound: at most C + r·T over any interval T
//
// Charging the store first is not enough on its own. Tokens leased from a
// full bucket, kept while the bucket refills, and then spent on top of a
// full bucket would admit C + r·T plus the lease. So a lease's unspent
// tokens lapse as the store could have refilled past them. For one
// bandwidth of capacity C and rate r, a refill sent at t0 (by this
// instance's clock, no later than the store decided it) that took k
// tokens and left the store with R whole tokens (so fewer than R+1) knew
// the store was then at least h = max(k, C−R−1) tokens short of full. At
// t its tokens are usable up to h − ⌈r·(t − t0)⌉, never more than are
// left.
//
// Why that keeps the key exact: let F(t) be when the store would be full
// if nothing more were taken; taking n tokens moves F by n/r, refilling
// does not move it, and C − level(t) = r·(F(t) − t). A refill's tokens
// moved F by k/r, from F′ to F″ = F′ + k/r, with F″ ≥ t0 + h/r, and every
// later call only moves F further. Its usable tokens at t are at most r
// times the part of [F″ − k/r, F″] still ahead of t. The instances'
// refills, one after another at the store, cover disjoint stretches of
// [t, F(t)], so all the usable tokens together are at most
// r·(F(t) − t) = C − level(t): the store's tokens plus every instance's
// usable lease never exceed C. Over any interval of length T a key can
// then admit no more than what was there at its start (≤ C) plus what
// refilled during it (r·T): C + r·T, whatever the number of instances
// and processes. With several bandwidths each holds on its own. A refill
// that a fail policy decided (Degraded), or that sharding gathered from
// sub-buckets, tells nothing exact about R: its h is k, which holds for
// any store (F″ − k/r ≥ t0).
//
// A FixedWindow of one bandwidth counts every token it charged in the
// window it charged it in; its leased tokens lapse when that window ends
// (the refill's ResetAfter, counted from when it was sent), so no window
// admits more than its capacity.
//
// [Leasable] says which configs can be leased: a token bucket of Greedy
// refill, GCRA and LeakyBucket; FixedWindow of one bandwidth on a key not
// split by sharding. The others are refused with an error naming the
// field: SlidingWindowLog and SlidingWindowCounter count a request when
// the store is charged, so a token spent later would leave their window
// early; Interval and IntervalAligned refill add their tokens at once, so
// no rate bounds what the store regains.
//
// # What it costs
//
// Unspent tokens are not given back to the store. A refund (an Add) would
// move F back under another instance's lease, which would then be usable
// on top of a store that refills as if it were not: the bound would break.
// They lapse instead. So a key can admit less than its limit, by at most
// the tokens held in leases: per instance, the last refills' tokens, at
// most 2 × WithMaxShare × C. A Close, or a process that is killed, loses
// its leases in the same way; a paused process finds them lapsed when it
// wakes (the monotonic clock runs on). A request can be denied in one
// instance while another holds tokens: docs/scale.md gives the measured
// false-rejection rates and the store calls saved.
//
// A leased decision's Remaining is the store's Remaining at the last
// refill plus what this instance holds, an estimate; a local denial's
// RetryAfter is when the store said its next token comes (for more than
// one token, an estimate from the refill rate).
//
// Add, Reset and Replace pass through, and drop this instance's lease of
// the key. Tokens they hand out (an Add, a Reset to full) are beyond the
// bound, with or without leases.
//
// # Composition
//
// [Layer] places the decorator above sharding, so that a split key's
// lease is gathered from its sub-buckets, and above the fail policy,
// whose deadline and breakers judge each refill: a Degraded refill (Open,
// Local) makes Degraded decisions. Below telemetry, which counts every
// decision, leased or not. The number of leased keys is capped
// ([WithMaxKeys]); leases idle for a second are dropped.
package lease
