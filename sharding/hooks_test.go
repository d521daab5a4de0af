package sharding

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/ratelimit"
)

// trace logs, in order, the sub-buckets a hot key's requests reach and
// the Retried hook's calls between them.
type trace struct {
	mu  sync.Mutex
	log []string
}

func (tr *trace) add(s string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.log = append(tr.log, s)
}

// take returns what was logged since the last take, and forgets it.
func (tr *trace) take() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	log := tr.log
	tr.log = nil
	return log
}

// traced is a Backend of rule over a recorder, with a Retried hook that
// logs to the trace; and the keys of hot's sub-buckets. The recorder logs
// each sub-bucket's call as "sub i" only once start is called, so that a
// test can set sub-buckets up unlogged.
type traced struct {
	b     *Backend
	rec   *recorder
	keys  []string
	trace *trace
}

func newTraced(t *testing.T, hot string, rule Rule) *traced {
	t.Helper()
	tc := &traced{rec: newRecorder(newMemory(t, newClock())), trace: new(trace)}
	tc.b = mustNew(t, tc.rec, rule, WithHooks(Hooks{
		Retried: func(ctx context.Context, key string, why RetryReason) {
			tc.trace.add(fmt.Sprintf("retried %q: %v", key, why))
		},
	}))
	tc.keys = subKeys(t, tc.b, hot)
	return tc
}

// start logs every sub-bucket call from now on.
func (tc *traced) start() {
	tc.rec.mu.Lock()
	defer tc.rec.mu.Unlock()
	tc.rec.before = func(_ context.Context, key string) {
		tc.trace.add(fmt.Sprintf("sub %d", slices.Index(tc.keys, key)))
	}
}

// drain empties sub-bucket i of the key split n ways under cfg, straight
// in the store.
func (tc *traced) drain(t *testing.T, cfg ratelimit.Config, n, i int) {
	t.Helper()
	sub := subConfig(cfg, n, i)
	if d := do(t, tc.rec, tc.keys[i], sub, upTo(sub.MinCapacity())); d.Remaining != 0 {
		t.Fatalf("sub-bucket %d: %+v after draining it", i, d)
	}
}

// TestHooksRetried: Retried is called once each time a request moves on
// to another sub-bucket, before that sub-bucket's call, with the reason
// the last one gave; never for a request its first sub-bucket decides,
// after the last try, or for the ops that go to every sub-bucket at once.
func TestHooksRetried(t *testing.T) {
	const n = 4
	cfg := config(ratelimit.PerHour(8)) // 2 a sub-bucket
	retried := func(why RetryReason) string { return fmt.Sprintf("retried %q: %v", "hot", why) }
	rejected, failed, degraded := retried(RetryRejected), retried(RetryFailed), retried(RetryDegraded)
	tests := []struct {
		name    string
		retries int
		prep    func(t *testing.T, tc *traced)
		req     ratelimit.Request
		allowed bool
		want    []string
	}{
		{"FirstTry", 1, nil, consume(2), true, []string{"sub 1"}},
		{"FirstTryEstimate", 1, nil, estimate(2), true, []string{"sub 1"}},
		{"FirstTryUpTo", 1, nil, upTo(2), true, []string{"sub 1"}},
		{"FirstTryDenied", 0, func(t *testing.T, tc *traced) { tc.drain(t, cfg, n, 1) }, consume(1), false, []string{"sub 1"}},
		{"RejectedThenAllowed", 1, func(t *testing.T, tc *traced) { tc.drain(t, cfg, n, 1) }, consume(1), true,
			[]string{"sub 1", rejected, "sub 2"}},
		{"ReserveRejectedThenAllowed", 1, func(t *testing.T, tc *traced) { tc.drain(t, cfg, n, 1) }, reserve(1, 0), true,
			[]string{"sub 1", rejected, "sub 2"}},
		{"RetriesSpent", 2, func(t *testing.T, tc *traced) {
			for i := range n {
				tc.drain(t, cfg, n, i)
			}
		}, consume(1), false, []string{"sub 1", rejected, "sub 2", rejected, "sub 3"}},
		{"Unavailable", 0, func(t *testing.T, tc *traced) { tc.rec.setFail(tc.keys[1], errDown) }, consume(1), true,
			[]string{"sub 1", failed, "sub 2"}},
		{"Timeout", 0, func(t *testing.T, tc *traced) { tc.rec.setFail(tc.keys[1], errTimeout) }, consume(1), true,
			[]string{"sub 1", failed, "sub 2"}},
		{"KeyRejected", 0, func(t *testing.T, tc *traced) { tc.rec.setFail(tc.keys[1], errRejected) }, consume(1), true,
			[]string{"sub 1", failed, "sub 2"}},
		{"Degraded", 0, func(t *testing.T, tc *traced) { tc.rec.setDegraded(tc.keys[1]) }, consume(1), true,
			[]string{"sub 1", degraded, "sub 2"}},
		{"NotCounted", 0, func(t *testing.T, tc *traced) {
			tc.rec.setFail(tc.keys[1], errDown)
			tc.rec.setDegraded(tc.keys[2])
			tc.drain(t, cfg, n, 3)
		}, consume(1), false, []string{"sub 1", failed, "sub 2", degraded, "sub 3"}},
		{"AllFailed", 0, func(t *testing.T, tc *traced) {
			for _, k := range tc.keys {
				tc.rec.setFail(k, errDown)
			}
		}, consume(1), false, []string{"sub 1", failed, "sub 2", failed, "sub 3", failed, "sub 0"}},
		{"UpToGathered", 2, func(t *testing.T, tc *traced) { tc.drain(t, cfg, n, 2) }, upTo(5), true,
			[]string{"sub 1", rejected, "sub 2", rejected, "sub 3"}},
		{"UpToFailed", 0, func(t *testing.T, tc *traced) { tc.rec.setFail(tc.keys[1], errTimeout) }, upTo(2), true,
			[]string{"sub 1", failed, "sub 2"}},
		{"UpToDegraded", 0, func(t *testing.T, tc *traced) { tc.rec.setDegraded(tc.keys[1]) }, upTo(2), true,
			[]string{"sub 1", degraded, "sub 2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := newTraced(t, "hot", Keys(n, "hot").WithRetries(tt.retries).WithAffinity(fixed(1)))
			if tt.prep != nil {
				tt.prep(t, tc)
			}
			tc.start()
			d, err := tc.b.Do(context.Background(), "hot", cfg, tt.req)
			if tt.name == "AllFailed" {
				if err == nil {
					t.Fatalf("%+v; want every sub-bucket's failure", d)
				}
			} else if err != nil || d.Allowed != tt.allowed {
				t.Fatalf("%+v, %v; want allowed %v", d, err, tt.allowed)
			}
			if got := tc.trace.take(); !slices.Equal(got, tt.want) {
				t.Errorf("logged\n\t%q\nwant\n\t%q", got, tt.want)
			}
		})
	}

	t.Run("AllAtOnce", func(t *testing.T) {
		tc := newTraced(t, "hot", Keys(n, "hot").WithAffinity(fixed(1)))
		tc.rec.setFail(tc.keys[0], errDown)
		tc.rec.setDegraded(tc.keys[2])
		tc.start()
		for _, req := range []ratelimit.Request{add(3), inspect(), reset(), replace(ratelimit.AsIs)} {
			_, _ = tc.b.Do(context.Background(), "hot", cfg, req)
			got := tc.trace.take()
			if len(got) != n || slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "retried") }) {
				t.Errorf("%v logged %q; want the %d sub-buckets' calls and no Retried", req.Op, got, n)
			}
		}
	})
}

// TestHooksRetriedArgs: Retried gets the caller's context and the hot key
// as the caller named it, not a sub-key, for a Prefix rule's key too.
func TestHooksRetriedArgs(t *testing.T) {
	type ctxKey struct{}
	ctx := context.WithValue(context.Background(), ctxKey{}, "caller's")
	const hot = "tenant:big:7"
	var got []string
	rec := newRecorder(newMemory(t, newClock()))
	b := mustNew(t, rec, Prefix(3, "tenant:big:").WithAffinity(fixed(0)), WithHooks(Hooks{
		Retried: func(ctx context.Context, key string, why RetryReason) {
			got = append(got, fmt.Sprintf("%v %q %v", ctx.Value(ctxKey{}), key, why))
		},
	}))
	keys := subKeys(t, b, hot)
	rec.setFail(keys[0], errDown)
	cfg := config(ratelimit.PerHour(30))
	if d, err := b.Do(ctx, hot, cfg, consume(1)); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v; want allowed by sub-bucket 1", d, err)
	}
	if want := []string{`caller's "tenant:big:7" failed`}; !slices.Equal(got, want) {
		t.Errorf("Retried got %q; want %q", got, want)
	}
}

// TestHooksUnset: with no hooks, or a Hooks whose Retried is nil, a
// request moves on as before.
func TestHooksUnset(t *testing.T) {
	cfg := config(ratelimit.PerHour(4))
	for _, opts := range [][]Option{nil, {WithHooks(Hooks{})}} {
		rec := newRecorder(newMemory(t, newClock()))
		b := mustNew(t, rec, append(opts, Keys(2, "hot").WithAffinity(fixed(0)))...)
		rec.setDegraded(subKeys(t, b, "hot")[0])
		if d := do(t, b, "hot", cfg, consume(1)); !d.Allowed || d.Degraded {
			t.Errorf("%d options: %+v; want allowed by sub-bucket 1", len(opts), d)
		}
	}
}

func TestRetryReasonString(t *testing.T) {
	for r, want := range map[RetryReason]string{
		RetryRejected: "rejected", RetryFailed: "failed", RetryDegraded: "degraded",
		0: "RetryReason(0)", 4: "RetryReason(4)", 255: "RetryReason(255)",
	} {
		if got := r.String(); got != want {
			t.Errorf("RetryReason(%d).String() = %q; want %q", uint8(r), got, want)
		}
	}
}

// TestLayer: Layer's place is PlaceSharding, and its Wrap is New's with
// a copy of the options: the same split, the same errors.
func TestLayer(t *testing.T) {
	mem := newMemory(t, newClock())
	opts := []Option{Keys(3, "hot")}
	l := Layer(opts...)
	opts[0] = Keys(2, "hot")
	if p := l.Place(); p != ratelimit.PlaceSharding {
		t.Errorf("Place() = %v; want %v", p, ratelimit.PlaceSharding)
	}
	next, err := l.Wrap(mem)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := next.(*Backend); !ok || len(subKeys(t, b, "hot")) != 3 {
		t.Errorf("Wrap returned %T; want a *Backend splitting hot 3 ways", next)
	}
	next, err = Layer(Keys(2, "fine"), Keys(1, "a")).Wrap(mem)
	if next != nil || !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), "sharding: rule 1: n must be") {
		t.Errorf("Wrap of a bad rule: %v, %v; want nil and New's error", next, err)
	}
	if _, err := Layer().Wrap(nil); !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Errorf("Wrap(nil): %v; want ErrInvalidConfig", err)
	}
}
