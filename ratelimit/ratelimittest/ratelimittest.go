package ratelimittest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Harness is what a backend gives the suite: a way to build it.
type Harness struct {
	// New returns a fresh, empty backend for one scenario. Unless
	// ServerClock is set, the backend must read time only from clock, which
	// the scenario moves by hand. Run calls New once per scenario, never two
	// scenarios at a time, so New may reset shared state such as a test
	// database; it should register any cleanup with t.Cleanup.
	New func(t *testing.T, clock ratelimit.Clock) ratelimit.Backend

	// ServerClock reports that the backend reads its store's own clock
	// (Redis TIME, say) and ignores clock, which is then a real-time clock.
	// The suite then skips the scenarios that step time exactly, moves time
	// by sleeping (a few hundred milliseconds in all), and checks each
	// Decision's RetryAfter and ResetAfter against a bound instead of an
	// exact value: at most the exact value, and less by no more than the
	// real time the scenario has run. Token counts stay exact, because every
	// scenario that runs under a real clock refills too slowly for a token
	// to return while it runs.
	ServerClock bool

	// Permits makes Run check the backend's concurrency permits too: it
	// must be a [ratelimit.PermitBackend], and the Permits group runs its
	// scenarios through DoPermit and the Limiter's permits.
	Permits bool
}

// epoch is where every scenario's fake clock starts.
var epoch = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// Run runs the conformance suite against the backend h builds, each
// scenario in its own subtest with its own backend and clock. Every scenario
// goes through [ratelimit.Backend.Do], [ratelimit.Limiter] or
// [ratelimit.Bucket] only, and uses keys no other run shares, so the
// backend may keep its buckets in a store that outlives the test.
func Run(t *testing.T, h Harness) {
	if h.New == nil {
		t.Fatal("ratelimittest: Harness.New is nil")
	}
	run := runID()
	groups := suite
	if h.Permits {
		groups = append(slices.Clip(groups), group{"Permits", permitScenarios})
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, s := range g.scenarios {
				t.Run(s.name, func(t *testing.T) {
					if s.fakeClock && h.ServerClock {
						t.Skip("ratelimittest: needs a fake clock; skipped with ServerClock")
					}
					s.run(t, newEnv(t, h, run))
				})
			}
		})
	}
}

// group is a set of scenarios on one theme; each becomes a subtest.
type group struct {
	name      string
	scenarios []scenario
}

// scenario is one leaf subtest.
type scenario struct {
	name string
	// fakeClock marks scenarios that step time by more than a test can
	// sleep, or check a duration to the microsecond.
	fakeClock bool
	run       func(t *testing.T, e *env)
}

// suite lists every group, in the order Run runs them.
var suite = []group{
	{"Counts", countScenarios},
	{"Refill", refillScenarios},
	{"MultiBandwidth", multiBandwidthScenarios},
	{"Ops", opScenarios},
	{"Inheritance", inheritanceScenarios},
	{"BadInput", badInputScenarios},
	{"Keys", keyScenarios},
	{"Wait", waitScenarios},
	{"Concurrency", concurrencyScenarios},
	{"Context", contextScenarios},
	{"Algorithms", algorithmScenarios},
	{"Versions", versionScenarios},
	{"RefillAfter", refillAfterScenarios},
	{"Ago", agoScenarios},
}

// runID tells this run's keys from those of earlier runs against the same
// store.
func runID() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// dec is short for the Decisions that fill the scenarios' tables.
type dec = ratelimit.Decision

// env is one scenario's backend, clock and key space.
type env struct {
	backend ratelimit.Backend
	clock   *Clock // nil with ServerClock
	started time.Time
	prefix  string
}

func newEnv(t *testing.T, h Harness, run string) *env {
	e := &env{prefix: keyPrefix(run, t.Name())}
	var clock ratelimit.Clock = wallClock{}
	if !h.ServerClock {
		e.clock = NewClock(epoch)
		clock = e.clock
	}
	e.backend = h.New(t, clock)
	if e.backend == nil {
		t.Fatal("ratelimittest: Harness.New returned a nil Backend")
	}
	e.started = time.Now()
	return e
}

// keyPrefix is unique to the run and the subtest. It holds no braces, so a
// backend's hash tag around the key sees the whole of it.
func keyPrefix(run, test string) string {
	if len(test) > 200 {
		h := fnv.New64a()
		h.Write([]byte(test))
		test = fmt.Sprintf("%x", h.Sum64())
	}
	return "ratelimittest:" + run + ":" + test + ":"
}

// key returns the scenario's key called name.
func (e *env) key(name string) string { return e.prefix + name }

// fake reports whether the scenario runs on the suite's fake clock.
func (e *env) fake() bool { return e.clock != nil }

// advance moves time on by d: the fake clock, or the real one by sleeping.
func (e *env) advance(d time.Duration) {
	if e.fake() {
		e.clock.Advance(d)
		return
	}
	time.Sleep(d)
}

// limiter returns a Limiter on the scenario's backend.
func (e *env) limiter(opts ...ratelimit.Option) *ratelimit.Limiter {
	return ratelimit.New(e.backend, opts...)
}

// bucket returns a Bucket on key whose config is always cfg.
func (e *env) bucket(key string, cfg ratelimit.Config, opts ...ratelimit.Option) *ratelimit.Bucket {
	return e.limiter(opts...).Bucket(key, func(context.Context) (ratelimit.Config, error) { return cfg, nil })
}

// do applies req and fails the test on error.
func (e *env) do(t *testing.T, key string, cfg ratelimit.Config, req ratelimit.Request) ratelimit.Decision {
	t.Helper()
	d, err := e.backend.Do(context.Background(), key, cfg, req)
	if err != nil {
		t.Fatalf("Do(%q, %s): %v", key, describe(req), err)
	}
	return d
}

// check compares a decision with the one wanted: exactly on the fake clock;
// under ServerClock with RetryAfter and ResetAfter allowed to fall short of
// the wanted value by the real time the scenario has run. It leaves out
// RefillAfter, which the RefillAfter scenarios check (see refillSteps):
// the other tables do not spell it out.
func (e *env) check(t *testing.T, what string, got, want ratelimit.Decision) {
	t.Helper()
	got.RefillAfter, want.RefillAfter = 0, 0
	if e.fake() {
		if got != want {
			t.Fatalf("%s:\n got %s\nwant %s", what, format(got), format(want))
		}
		return
	}
	slack := time.Since(e.started) + time.Millisecond
	within := func(got, want time.Duration) bool { return got <= want && got >= want-slack }
	g, w := got, want
	g.RetryAfter, g.ResetAfter, w.RetryAfter, w.ResetAfter = 0, 0, 0, 0
	if g != w || !within(got.RetryAfter, want.RetryAfter) || !within(got.ResetAfter, want.ResetAfter) {
		t.Fatalf("%s:\n got %s\nwant %s\n(durations may fall short by up to %v under ServerClock)", what, format(got), format(want), slack)
	}
}

// step is one call in a scripted sequence on one bucket.
type step struct {
	advance time.Duration     // moved on before the call
	cfg     *ratelimit.Config // nil: the sequence's config
	req     ratelimit.Request
	want    ratelimit.Decision
}

// steps runs a sequence of calls on key, checking each decision.
func (e *env) steps(t *testing.T, key string, cfg ratelimit.Config, steps []step) {
	t.Helper()
	for i, s := range steps {
		if s.advance != 0 {
			e.advance(s.advance)
		}
		c := cfg
		if s.cfg != nil {
			c = *s.cfg
		}
		got := e.do(t, key, c, s.req)
		e.check(t, fmt.Sprintf("step %d (after %v more): %s", i, s.advance, describe(s.req)), got, s.want)
	}
}

// config builds a Config of the given bandwidths.
func config(bws ...ratelimit.Bandwidth) ratelimit.Config {
	return ratelimit.Config{Bandwidths: bws}
}

// Request builders, named for the op.

func consume(n int64) ratelimit.Request  { return ratelimit.Request{Op: ratelimit.Consume, Tokens: n} }
func estimate(n int64) ratelimit.Request { return ratelimit.Request{Op: ratelimit.Estimate, Tokens: n} }
func upTo(n int64) ratelimit.Request     { return ratelimit.Request{Op: ratelimit.ConsumeUpTo, Tokens: n} }
func add(n int64) ratelimit.Request      { return ratelimit.Request{Op: ratelimit.Add, Tokens: n} }
func inspect() ratelimit.Request         { return ratelimit.Request{Op: ratelimit.Inspect} }
func reset() ratelimit.Request           { return ratelimit.Request{Op: ratelimit.Reset} }

func reserve(n int64, maxWait time.Duration) ratelimit.Request {
	return ratelimit.Request{Op: ratelimit.Reserve, Tokens: n, MaxWait: maxWait}
}

func replace(s ratelimit.Inheritance) ratelimit.Request {
	return ratelimit.Request{Op: ratelimit.Replace, Strategy: s}
}

func describe(r ratelimit.Request) string {
	s := fmt.Sprintf("%v(%d)", r.Op, r.Tokens)
	if r.MaxWait != 0 {
		s += fmt.Sprintf(" MaxWait=%v", r.MaxWait)
	}
	if r.Strategy != 0 || r.Op == ratelimit.Replace {
		s += fmt.Sprintf(" Strategy=%v", r.Strategy)
	}
	if r.Ago != 0 {
		s += fmt.Sprintf(" Ago=%v", r.Ago)
	}
	return s
}

func format(d ratelimit.Decision) string {
	return fmt.Sprintf("{Allowed:%v Limit:%d Remaining:%d Consumed:%d RetryAfter:%v ResetAfter:%v RefillAfter:%v Bandwidth:%q Degraded:%v}",
		d.Allowed, d.Limit, d.Remaining, d.Consumed, d.RetryAfter, d.ResetAfter, d.RefillAfter, d.Bandwidth, d.Degraded)
}
