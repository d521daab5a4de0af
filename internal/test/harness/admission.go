package harness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// Bucket is one bucket of an admission run: an algorithm with one
// bandwidth.
type Bucket struct {
	Name      string
	Algorithm ratelimit.Algorithm
	Bandwidth ratelimit.Bandwidth
}

// Config is the bucket's ratelimit.Config.
func (b Bucket) Config() ratelimit.Config {
	return ratelimit.Config{Algorithm: b.Algorithm, Bandwidths: []ratelimit.Bandwidth{b.Bandwidth}}
}

// NoRefill is a token bucket of the given capacity that refills one token
// an hour: a thousandth of a token within a run of seconds, so that it
// admits no more than its capacity.
func NoRefill(capacity int64) ratelimit.Bandwidth {
	return ratelimit.PerHour(1).WithBurst(capacity)
}

// Buckets are the buckets of the exact-admission runs, each of the given
// capacity: a token bucket that refills one token an hour (a thousandth of
// a token within a run of seconds, so it admits exactly its capacity), one
// that refills 100 tokens a second (so it admits what the server's clock
// allows), and GCRA and the leaky bucket at one an hour; then each window
// algorithm at capacity an hour, whose window is a thousand times a run's
// span, so that the token bucket's bound is theirs too.
func Buckets(capacity int64) []Bucket {
	noRefill := NoRefill(capacity)
	b := []Bucket{
		{"TokenBucket", ratelimit.TokenBucket, noRefill},
		{"TokenBucketRefill", ratelimit.TokenBucket, ratelimit.Every(10*time.Millisecond, 1).WithBurst(capacity)},
		{"GCRA", ratelimit.GCRA, noRefill},
		{"LeakyBucket", ratelimit.LeakyBucket, noRefill},
	}
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter} {
		b = append(b, Bucket{alg.String(), alg, ratelimit.PerHour(capacity)})
	}
	return b
}

// Tally is what a run's calls add up to: Admitted and Denied count the
// store's decisions, Degraded those a fail policy made instead, Failed
// the calls that returned an error.
type Tally struct {
	Calls, Admitted, Denied, Degraded, Failed int
	// Unknown are the tokens of the failed calls whose outcome is unknown
	// ([Call.Unknown]): each may or may not have taken its Tokens.
	Unknown int64
	// First and Last are the earliest start and the latest end, in ns.
	First, Last int64
	// Longest is the longest of the calls that returned.
	Longest time.Duration
}

// Count adds up calls.
func Count(calls []Call) Tally {
	var n Tally
	for _, c := range calls {
		n = n.Add(c)
	}
	return n
}

// Add returns n with the call c added.
func (n Tally) Add(c Call) Tally {
	if n.Calls == 0 || c.Start < n.First {
		n.First = c.Start
	}
	n.Last = max(n.Last, c.End)
	if c.End != 0 {
		n.Longest = max(n.Longest, time.Duration(c.End-c.Start))
	}
	n.Calls++
	switch {
	case c.Err != "":
		n.Failed++
		if c.Unknown() {
			n.Unknown += c.Tokens
		}
	case c.Decision.Degraded:
		n.Degraded++
	case c.Decision.Allowed:
		n.Admitted++
	default:
		n.Denied++
	}
	return n
}

// Span is the time from the first call's start to the last one's end.
func (n Tally) Span() time.Duration { return time.Duration(n.Last - n.First) }

// Rate is the calls a second over the Span.
func (n Tally) Rate() float64 { return float64(n.Calls) / n.Span().Seconds() }

// Bounds are what a token bucket may admit over a run, from the tokens it
// holds at the end: it starts full, takes only what it admits, and gains at
// most RefillTokens per RefillPeriod of the span between T0, read from the
// server's clock before the first call, and T1, read after the final
// Inspect. With L the fractional tokens at the end,
//
//	admitted + L = Capacity + refilled − lost to a full bucket
//
// so Capacity ≤ admitted + L ≤ Capacity + refill(T1−T0), and since
// Remaining = ⌊L⌋ and admitted is whole,
//
//	Capacity ≤ admitted + Remaining ≤ ⌊Capacity + refill(T1−T0)⌋.
//
// A call whose outcome is unknown (a timeout, a connection lost after the
// command was sent, an instance killed mid-call) may have taken its
// tokens without being counted as admitted: those tokens, the tally's
// Unknown, lower the low bound and never raise the high one, so
//
//	Low − Unknown ≤ admitted + Remaining ≤ High.
//
// Admitted counts calls: the bounds hold for runs whose calls Consume one
// token each, as every admission run's do.
type Bounds struct {
	Low, High int64
	// Span is T1−T0, of the server's clock.
	Span time.Duration
}

// TokenBucketBounds are the Bounds of a bucket of bandwidth bw over the
// server-clock span from t0 to t1.
func TokenBucketBounds(bw ratelimit.Bandwidth, t0, t1 time.Time) Bounds {
	span := t1.Sub(t0)
	refill := bw.RefillTokens * int64(span/time.Microsecond) / int64(bw.RefillPeriod/time.Microsecond)
	return Bounds{Low: bw.Capacity, High: bw.Capacity + refill, Span: span}
}

// Check returns an error unless a run's tally and the bucket's Remaining
// after it lie within b: admitted + remaining at most High (so admitted
// at most High, whatever failed), and at least Low less the tokens of the
// calls whose outcome is unknown. Without refill and unknowns, a run of at
// least b.Low calls that did not fail must admit exactly b.Low.
func (b Bounds) Check(n Tally, remaining int64) error {
	admitted := int64(n.Admitted)
	if admitted > b.High {
		return fmt.Errorf("admitted %d, %d over the bound: want admitted + remaining within [%d, %d] over %v of server time",
			n.Admitted, admitted-b.High, b.Low, b.High, b.Span)
	}
	if sum := admitted + remaining; sum > b.High {
		return fmt.Errorf("admitted %d + remaining %d = %d, %d over the bound: want admitted + remaining within [%d, %d] over %v of server time",
			n.Admitted, remaining, sum, sum-b.High, b.Low, b.High, b.Span)
	}
	if sum := admitted + n.Unknown + remaining; sum < b.Low {
		return fmt.Errorf("admitted %d + %d unknown + remaining %d = %d, %d under the bound: want admitted + remaining within [%d − %d unknown, %d] over %v of server time",
			n.Admitted, n.Unknown, remaining, sum, b.Low-sum, b.Low, n.Unknown, b.High, b.Span)
	}
	if b.High == b.Low && n.Unknown == 0 && int64(n.Calls-n.Failed) >= b.Low && admitted != b.Low {
		return fmt.Errorf("admitted %d of %d calls without refill; want exactly %d", n.Admitted, n.Calls-n.Failed, b.Low)
	}
	return nil
}

// Run is an admission run: Processes instances of Program, each running
// Spec, on a new bucket.
type Run struct {
	Program   Program
	Processes int
	Spec      Spec
	// Drive releases the instances and runs the phases of the spec's
	// holds; nil means one Go, for a spec without holds.
	Drive func(in *Instances) error
	// Observer reads the bucket after the run with its Backend, and the
	// clock of the server that holds it with its Redis, which must be
	// set. The caller closes it. Nil means a go-redis Conn of Spec, which
	// Measure makes and closes: the instances' backend if it is the
	// racy one, else the go-redis one.
	Observer *Conn
}

// Result is what an admission run found.
type Result struct {
	// Calls are every call the instances reported, as [Instances.Wait]
	// returns them, and Tally what they add up to.
	Calls []Call
	Tally Tally
	// Remaining is the whole tokens the bucket held after the run, by
	// Inspect.
	Remaining int64
	// Bounds are what the bucket may admit, by the server's clock.
	Bounds Bounds
}

// Check is r.Bounds.Check of the run's tally and remaining tokens.
func (r Result) Check() error { return r.Bounds.Check(r.Tally, r.Remaining) }

// Measure makes run r and returns its calls and the bucket's bounds: it
// starts the instances, reads T0 from the clock of the server that holds
// the bucket, drives them, waits for them, reads the bucket's Remaining
// with Inspect and then T1. The bucket's first bandwidth gives the bounds.
// Measure does not check them; [Result.Check] does. If ctx ends first,
// Measure kills the instances and returns an error.
func Measure(ctx context.Context, r Run) (Result, error) {
	obs := r.Observer
	if obs == nil {
		var err error
		if obs, err = observe(r.Spec); err != nil {
			return Result{}, err
		}
		defer obs.Close()
	}
	if obs.Redis == nil {
		return Result{}, errors.New("harness: the run's Observer has no Redis client to read the server's clock with")
	}
	in, err := Start(r.Program, r.Processes, r.Spec)
	if err != nil {
		return Result{}, err
	}
	defer in.Close()
	// An end of ctx ends the run: the instances are killed, and Wait
	// returns an error.
	defer context.AfterFunc(ctx, in.Close)()
	t0, err := ServerTime(ctx, obs.Redis, r.Spec.Prefix, r.Spec.Key)
	if err != nil {
		return Result{}, err
	}
	drive := r.Drive
	if drive == nil {
		drive = (*Instances).Go
	}
	if err := drive(in); err != nil {
		return Result{}, err
	}
	calls, err := in.Wait()
	if err != nil {
		return Result{}, err
	}
	d, err := obs.Backend.Do(ctx, r.Spec.Key, r.Spec.Config, ratelimit.Request{Op: ratelimit.Inspect})
	if err != nil {
		return Result{}, fmt.Errorf("harness: Inspect after the run: %w", err)
	}
	t1, err := ServerTime(ctx, obs.Redis, r.Spec.Prefix, r.Spec.Key)
	if err != nil {
		return Result{}, err
	}
	return Result{
		Calls:     calls,
		Tally:     Count(calls),
		Remaining: d.Remaining,
		Bounds:    TokenBucketBounds(r.Spec.Config.Bandwidths[0], t0, t1),
	}, nil
}

// observe connects to spec's Redis on a go-redis client, with the backend
// that reads the bucket as spec's instances keep it: the go-redis one
// (which shares the rueidis one's layout), or the racy one.
func observe(spec Spec) (*Conn, error) {
	if spec.Backend != BackendRacy {
		spec.Backend = BackendGoRedis
	}
	return Connect(spec)
}

// ServerTime reads the clock of the server that holds the bucket at key
// under prefix, through c: the clock its script reads.
func ServerTime(ctx context.Context, c redis.UniversalClient, prefix, key string) (time.Time, error) {
	node, err := Node(ctx, c, prefix, key)
	if err != nil {
		return time.Time{}, err
	}
	now, err := node.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("harness: TIME: %w", err)
	}
	return now, nil
}

// Node returns the client of the server that holds the bucket at key
// under prefix: c itself on a standalone server or a Sentinel's master,
// the key's master on a cluster.
func Node(ctx context.Context, c redis.UniversalClient, prefix, key string) (*redis.Client, error) {
	switch c := c.(type) {
	case *redis.ClusterClient:
		master, err := c.MasterForKey(ctx, redisscript.Key(prefix, key))
		if err != nil {
			return nil, fmt.Errorf("harness: the master of key %q: %w", key, err)
		}
		return master, nil
	case *redis.Client:
		return c, nil
	}
	return nil, fmt.Errorf("harness: %T is neither a *redis.Client nor a *redis.ClusterClient", c)
}
