package harness

import (
	"time"

	"github.com/sluicehq/sluice/internal/redisconn"
	"github.com/sluicehq/sluice/ratelimit"
)

// Backends a [Spec] may name.
const (
	// BackendGoRedis is backend/redis on a go-redis client.
	BackendGoRedis = "goredis"
	// BackendRueidis is backend/rueidis on a rueidis client.
	BackendRueidis = "rueidis"
	// BackendRacy reads the bucket (or the key's permits) with GET,
	// decides in Go with ratelimit.Apply (ApplyPermit) and writes it back
	// with SET: deliberately not atomic, so that a checker can be shown
	// to catch it. Tests only.
	BackendRacy = "racy"
)

// Spec is what every process of a distributed run does: it connects to
// Redis with Backend as [Server] says, then, once released, runs
// Goroutines goroutines that make Attempts calls in all on the bucket at
// Key with Config, or, in a permits run (Permits), on Key's permits.
type Spec struct {
	// Backend is BackendGoRedis, BackendRueidis or BackendRacy.
	Backend string
	// Server says where Redis is and how to reach it.
	Server
	// Key and Config name the bucket; every call uses them.
	Key    string
	Config ratelimit.Config
	// Requests are the calls to make, in turn: attempt i of the instance
	// makes Requests[i % len(Requests)]. Empty means Consume of 1 token.
	Requests []ratelimit.Request
	// Goroutines make the calls concurrently, taking the next attempt as
	// each finishes one (in a permits run, each its own: see [Permits]);
	// Attempts is this instance's total.
	Goroutines, Attempts int
	// Timeout bounds each call; 0 means 10s.
	Timeout time.Duration
	// Policy, if set, puts the backend behind a fail policy.
	Policy *Policy
	// Shard, if set, splits Key into sub-buckets with the sharding
	// package, outside the fail policy if there is one (as sharding's
	// package doc advises).
	Shard *Shard
	// Lease, if set, leases Key's tokens with the lease package, outside
	// the shard and the fail policy if there are any (the order of
	// ratelimit.Stack): a Consume of Key is then decided from this
	// instance's lease.
	Lease *Lease
	// Pause is how long each goroutine waits after a call before it takes
	// the next attempt: a steady load rather than a flood.
	Pause time.Duration
	// Settle makes the instance, after its attempts, make Estimate calls
	// of 1 token, 50ms apart, until one is decided by the store (not
	// Degraded) or 30s have passed, when it gives up as Fatal. With a
	// policy in Local mode, the store has then been charged every debt of
	// the key's share. Settle calls take nothing and are not reported.
	Settle bool
	// Holds divide the attempts into phases, so that a caller can act
	// between them without racing the calls: at each hold, in order, no
	// goroutine starts attempt At or a later one until the harness
	// releases the hold ([Instances.Go], [Instances.Release]). Once every
	// attempt before At has started (some may still be in flight, until
	// [Instances.WaitIdle]), the instance reports that it holds, which
	// [Instances.WaitHeld] waits for. Each At must be after the previous
	// one and before Attempts.
	Holds []Hold
	// Permits, if set, makes the run one of concurrency permits on Key
	// rather than of calls on a bucket: Config, Requests, Shard, Lease and
	// Settle are then unused (and Shard, Lease and Settle must not be
	// set). See [Permits].
	Permits *Permits `json:",omitempty"`
}

// Server says where a run's Redis is and how a client reaches it (the
// [redisconn.Server] every client of the run is built of), and the key
// prefix of the run's backend.
type Server struct {
	// Server is where Redis is and how a client reaches it; its zero
	// value but Addrs is a plain connection to a standalone server with
	// the client settings sluice's docs recommend.
	redisconn.Server
	// Prefix is the backend's key prefix (WithPrefix): every key a run
	// makes starts with it.
	Prefix string
}

// Policy is the fail policy of [Spec].Policy: the failpolicy.Wrap of the
// backend, with these options where they are set and failpolicy's
// defaults where they are zero.
type Policy struct {
	// Mode is the failpolicy.Mode, by name: "Open", "Closed" or "Local".
	Mode string
	// Timeout is the WithTimeout.
	Timeout time.Duration
	// Instances is the WithInstances.
	Instances int
}

// Shard is the split of [Spec].Shard: sharding.New of the backend (behind
// its policy, if any) with the rule sharding.Keys(N, Key).WithRetries(Retries).
type Shard struct {
	N, Retries int
}

// Lease is the leasing of [Spec].Lease: lease.New of the backend (behind
// its shard and policy, if any) with the rule lease.Keys(Key), and these
// options where they are set, the lease package's defaults where they are
// zero. The instance closes it once its calls are done.
type Lease struct {
	// Target is the WithTarget.
	Target time.Duration
	// MaxShare is the WithMaxShare.
	MaxShare float64
}

// Hold is one of [Spec].Holds.
type Hold struct {
	// At is the first attempt held back.
	At int
	// Timeout bounds each call from attempt At to the next hold; 0
	// means the spec's Timeout.
	Timeout time.Duration
}

// Call is one call an instance made, as it reports it.
type Call struct {
	// Instance is the index of the process; Goroutine, of the goroutine in it.
	Instance, Goroutine int
	// Attempt is the instance's attempt number: on a bucket, the call
	// made Spec.Requests[Attempt % len(Spec.Requests)].
	Attempt int
	// Start and End are the wall-clock times, in ns since the Unix epoch,
	// just before the call and just after it returned. Every instance runs
	// on the harness's machine, so they read one clock.
	Start, End int64
	// Decision is the call's decision; meaningless when Err is set.
	Decision ratelimit.Decision
	// Err is the error the call returned, or "", or [ErrUnreported].
	Err string
	// Refused says that Err is one that leaves the bucket alone: the
	// call was refused before it could take anything (invalid input, or a
	// key the store rejects). Any other error, a timeout
	// or a connection lost after the command was sent, leaves the call's
	// outcome unknown: it may or may not have taken its Tokens.
	Refused bool `json:",omitempty"`
	// Tokens are the tokens the call takes if admitted: its request's for
	// Consume and ConsumeUpTo (at most that many), 0 for the others.
	Tokens int64 `json:",omitempty"`
	// Permit is, in a permits run ([Spec].Permits), the call's request and
	// decision (Decision is then unused); nil in a run on a bucket.
	Permit *PermitCall `json:",omitempty"`
}

// Unknown says whether the call's outcome is unknown: it returned an error
// that does not say the bucket was left alone, or it was never reported.
func (c Call) Unknown() bool { return c.Err != "" && !c.Refused }

// ErrUnreported is the Err of a call that an instance started but never
// reported, because it died; End is then 0.
const ErrUnreported = "unreported: the instance died during the call"

// Line is one line, in JSON after [LinePrefix], that an instance writes on
// stdout: Ready once connected; then for each call, Started (Instance,
// Goroutine, Attempt and Start) just before it and Call as it returns,
// with Held at each of the spec's holds; then Done. Or Fatal when it gives
// up.
type Line struct {
	Ready   bool   `json:",omitempty"`
	Held    bool   `json:",omitempty"`
	Done    bool   `json:",omitempty"`
	Fatal   string `json:",omitempty"`
	Started *Call  `json:",omitempty"`
	Call    *Call  `json:",omitempty"`
}

// LinePrefix starts each [Line] on an instance's stdout. What the program
// writes there besides (a test binary's "PASS", a test's own prints) is
// not a Line, and only shows among the instance's last lines when it
// fails; a Line written after output that did not end its line is found
// where the prefix starts. JSON escapes the prefix's first byte, the ASCII
// record separator, so no Line holds it.
const LinePrefix = "\x1esluice-harness "

// GoLine is the line the harness writes on an instance's stdin, after the
// spec, to release it, and again to release each of its holds.
const GoLine = "go\n"
