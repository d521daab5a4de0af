package sharding

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// TestConformancePassThrough: with rules that match none of the suite's
// keys, the decorator passes the conformance suite as the memory backend
// does, its permits included.
func TestConformancePassThrough(t *testing.T) {
	ratelimittest.Run(t, ratelimittest.Harness{
		Permits: true,
		New: func(t *testing.T, c ratelimit.Clock) ratelimit.Backend {
			return mustNew(t, newMemory(t, c), Keys(4, "hot"), Prefix(3, "zzz-hot:"))
		},
	})
}

// TestPassThrough: a key no rule matches gets, call for call, the decisions
// and errors the bare backend gives.
func TestPassThrough(t *testing.T) {
	clock := newClock()
	bare := newMemory(t, clock)
	b := mustNew(t, newMemory(t, clock), Keys(4, "hot"), Prefix(3, "zzz-hot:"), Match(5, func(k string) bool { return strings.HasSuffix(k, "!") }))
	cfg := config(ratelimit.Every(time.Second, 3).WithBurst(10), ratelimit.PerHour(50).WithID("hourly"))
	upgraded := config(ratelimit.Every(time.Second, 5).WithBurst(20), ratelimit.PerHour(100).WithID("hourly"))
	window := ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(7)}}
	steps := []struct {
		advance time.Duration
		cfg     ratelimit.Config
		req     ratelimit.Request
	}{
		{0, cfg, consume(1)}, {0, cfg, consume(4)}, {0, cfg, estimate(6)}, {0, cfg, consume(6)},
		{0, cfg, reserve(3, time.Second)}, {300 * time.Millisecond, cfg, inspect()}, {0, cfg, upTo(8)},
		{2 * time.Second, cfg, add(3)}, {0, cfg, upTo(100)}, {0, upgraded, consume(1)},
		{0, upgraded, replace(ratelimit.Proportionally)}, {time.Minute, upgraded, consume(7)}, {0, upgraded, reset()},
		{0, cfg, consume(11)}, {0, cfg, ratelimit.Request{Op: 42}}, {0, config(ratelimit.PerHour(0)), consume(1)},
		{0, window, consume(7)}, {0, window, consume(1)}, {0, window, reserve(1, time.Minute)}, {61 * time.Second, window, consume(1)},
	}
	keys := []string{"cold", "hot2", "ho", "zzz-hot", "hot\x00abc", "hot\x00", "cold\x000.4", "\x000.4", "!cold", "", strings.Repeat("x", 513)}
	for _, key := range keys {
		for i, s := range steps {
			clock.Advance(s.advance)
			want, wantErr := bare.Do(context.Background(), key, s.cfg, s.req)
			got, err := b.Do(context.Background(), key, s.cfg, s.req)
			if got != want || (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
				t.Fatalf("key %q, step %d (%v %d): got %+v, %v;\nthe bare backend %+v, %v", key, i, s.req.Op, s.req.Tokens, got, err, want, wantErr)
			}
		}
	}
}

// TestPassThroughAllocs: passing a call through allocates nothing beyond
// what the backend does.
func TestPassThroughAllocs(t *testing.T) {
	clock := newClock()
	bare := newMemory(t, clock)
	hooks := WithHooks(Hooks{Retried: func(context.Context, string, RetryReason) { t.Error("Retried called for a key passed through") }})
	b := mustNew(t, newMemory(t, clock), Keys(4, "hot"), Prefix(3, "zzz-hot:"), Match(5, func(k string) bool { return k == "match" }), hooks)
	cfg := config(ratelimit.PerHour(1_000_000_000))
	ctx := context.Background()
	allocs := func(be ratelimit.Backend, key string) float64 {
		do(t, be, key, cfg, consume(1)) // an existing bucket
		return testing.AllocsPerRun(200, func() {
			if _, err := be.Do(ctx, key, cfg, consume(1)); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, key := range []string{"cold", "hot\x00abc"} {
		if got, want := allocs(b, key), allocs(bare, key); got != want {
			t.Errorf("%q: a call passed through allocates %v times; the bare backend's %v", key, got, want)
		}
	}
}

// TestSubKeysRejected: a key of the form hot key, NUL, digits and dots is
// an error wrapping ErrInvalidKey, and changes nothing, whichever rule
// makes its head hot, and even when a rule matches the whole key too; so
// is Slots of it. Bad input is still CheckRequest's error first.
func TestSubKeysRejected(t *testing.T) {
	cfg := config(ratelimit.PerHour(12))
	for _, slots := range []bool{false, true} {
		mem := newMemory(t, newClock())
		rec := newRecorder(mem)
		var next ratelimit.Backend = rec
		if slots {
			next = slotted{rec}
		}
		b := mustNew(t, next, Keys(4, "hot"), Keys(3, "api:global"), Prefix(3, "api:"), Match(2, func(k string) bool { return strings.HasPrefix(k, "m") }))
		for _, hot := range []string{"hot", "api:global", "api:tenant", "m"} {
			do(t, b, hot, cfg, consume(1))
		}
		before := do(t, b, "hot", cfg, inspect())
		rec.calls()
		var keys []string
		for _, hot := range []string{"hot", "api:global", "api:tenant", "m"} {
			keys = append(keys, subKeys(t, b, hot)...)
			keys = append(keys, hot+"\x001", hot+"\x00.", hot+"\x0099.99.99", hot+"\x000.4")
		}
		for _, key := range keys {
			for _, req := range []ratelimit.Request{consume(1), upTo(5), add(5), reset(), inspect()} {
				_, err := b.Do(context.Background(), key, cfg, req)
				if !isInvalidKey(err) || !strings.Contains(err.Error(), "names a sub-bucket of a hot key") {
					t.Errorf("slots %v: %v on %q: %v; want ErrInvalidKey: names a sub-bucket", slots, req.Op, key, err)
				}
			}
			if subs, err := b.Slots(context.Background(), key); !isInvalidKey(err) || subs != nil {
				t.Errorf("slots %v: Slots(%q): %v, %v; want ErrInvalidKey", slots, key, subs, err)
			}
			bad := config(ratelimit.PerHour(0))
			if _, err := b.Do(context.Background(), key, bad, consume(1)); err == nil || err.Error() != ratelimit.CheckRequest(key, bad, consume(1)).Error() {
				t.Errorf("slots %v: a bad config on %q: %v; want CheckRequest's error", slots, key, err)
			}
		}
		if calls := rec.calls(); len(calls) != 0 {
			t.Errorf("slots %v: the rejected keys reached the backend: %q", slots, calls)
		}
		if after := do(t, b, "hot", cfg, inspect()); after != before {
			t.Errorf("slots %v: the hot key went from %+v to %+v", slots, before, after)
		}
		// Not of the form: passed through as they are.
		for _, key := range []string{"hot\x00abc", "hot\x000.4x", "hot\x00", "cold\x000.4", "\x000.4", "hot\x00\x000.4"} {
			rec.calls()
			do(t, b, key, cfg, consume(1))
			if calls := rec.calls(); len(calls) != 1 || calls[0] != key {
				t.Errorf("slots %v: Consume on %q called the backend with %q; want the key as it is", slots, key, calls)
			}
		}
	}
}

// TestTokensBeyondShare: a Consume, Estimate or Reserve of more than the
// smallest sub-bucket holds is an ErrInvalidRequest that touches no
// sub-bucket; at that size, it passes.
func TestTokensBeyondShare(t *testing.T) {
	rec := newRecorder(newMemory(t, newClock()))
	b := mustNew(t, rec, Keys(4, "hot"))
	cfg := config(ratelimit.PerHour(11), ratelimit.PerSecond(100)) // shares 3, 3, 3, 2
	for _, op := range []ratelimit.Op{ratelimit.Consume, ratelimit.Estimate, ratelimit.Reserve} {
		req := ratelimit.Request{Op: op, Tokens: 3}
		_, err := b.Do(context.Background(), "hot", cfg, req)
		if !errors.Is(err, ratelimit.ErrInvalidRequest) || !strings.Contains(err.Error(), "Tokens 3 is more than one of its 4 sub-buckets holds (2)") {
			t.Errorf("%v(3): %v; want ErrInvalidRequest naming Tokens and the share, 2", op, err)
		}
		if calls := rec.calls(); len(calls) != 0 {
			t.Errorf("%v(3) reached the backend: %q", op, calls)
		}
		req.Tokens = 2
		if d := do(t, b, "hot", cfg, req); !d.Allowed {
			t.Errorf("%v(2): %+v; want allowed", op, d)
		}
		rec.calls()
	}
	if got := do(t, b, "hot", cfg, inspect()).Remaining; got != 11-4 {
		t.Errorf("after a Consume and a Reserve of 2: %d left; want 7", got)
	}
}

// TestBadInputFirst: on a hot key, a bad key, config or request is
// CheckRequest's error, before any sub-bucket is touched and before the
// context is looked at; the longest key passes; and a call whose context
// is done takes nothing.
func TestBadInputFirst(t *testing.T) {
	rec := newRecorder(newMemory(t, newClock()))
	b := mustNew(t, rec, Keys(4, "hot"), Prefix(4, "p:"))
	good := config(ratelimit.PerHour(100))
	window := ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(100)}}
	long := "p:" + strings.Repeat("x", ratelimit.MaxKeyLen)
	tests := []struct {
		name string
		key  string
		cfg  ratelimit.Config
		req  ratelimit.Request
	}{
		{"Capacity", "hot", config(ratelimit.PerHour(0)), consume(1)},
		{"NoBandwidths", "hot", ratelimit.Config{}, inspect()},
		{"Algorithm", "hot", ratelimit.Config{Algorithm: 99, Bandwidths: good.Bandwidths}, consume(1)},
		{"TokensZero", "hot", good, consume(0)},
		{"TokensAboveCapacity", "hot", good, estimate(101)},
		{"UpToZero", "hot", good, upTo(0)},
		{"AddZero", "hot", good, add(0)},
		{"Op", "hot", good, ratelimit.Request{Op: 42, Tokens: 1}},
		{"Strategy", "hot", good, ratelimit.Request{Op: ratelimit.Replace, Strategy: 9}},
		{"MaxWait", "hot", good, reserve(1, -time.Second)},
		{"ReserveWindow", "hot", window, reserve(1, time.Second)},
		{"KeyTooLong", long, good, consume(1)},
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := ratelimit.CheckRequest(tt.key, tt.cfg, tt.req)
			if want == nil {
				t.Fatal("CheckRequest passes it")
			}
			for _, ctx := range []context.Context{context.Background(), cancelled} {
				_, err := b.Do(ctx, tt.key, tt.cfg, tt.req)
				if err == nil || err.Error() != want.Error() {
					t.Errorf("%v; want CheckRequest's %v", err, want)
				}
			}
			if calls := rec.calls(); len(calls) != 0 {
				t.Errorf("reached the backend: %q", calls)
			}
		})
	}
	t.Run("LongestKey", func(t *testing.T) {
		key := long[:ratelimit.MaxKeyLen]
		if d, err := b.Do(context.Background(), key, good, consume(1)); err != nil || !d.Allowed {
			t.Errorf("Consume on a key of MaxKeyLen bytes: %+v, %v; want allowed", d, err)
		}
		if calls := rec.calls(); len(calls) != 1 || len(calls[0]) > ratelimit.MaxKeyLen {
			t.Errorf("called the backend with %q; want one sub-key of at most MaxKeyLen bytes", calls)
		}
	})
	t.Run("ContextDone", func(t *testing.T) {
		for _, req := range []ratelimit.Request{consume(1), upTo(3), add(1), inspect(), reset()} {
			_, err := b.Do(cancelled, "hot", good, req)
			if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), `context canceled: sharding: `+req.Op.String()+` on key "hot"`) {
				t.Errorf("%v: %v; want context.Canceled", req.Op, err)
			}
		}
		if calls := rec.calls(); len(calls) != 0 {
			t.Errorf("reached the backend: %q", calls)
		}
	})
}

// TestNewRefusesBadRules: every bad rule is an error wrapping
// ErrInvalidConfig that names the rule and what is wrong, and New returns
// no Backend.
func TestNewRefusesBadRules(t *testing.T) {
	mem := newMemory(t, newClock())
	ok := Keys(2, "fine")
	tests := []struct {
		name  string
		rules []Rule
		want  string
	}{
		{"Zero", []Rule{{}}, "rule 0: it matches no key"},
		{"KeysNone", []Rule{Keys(4)}, "rule 0: it matches no key"},
		{"KeysEmpty", []Rule{ok, Keys(4, []string{}...)}, "rule 1: Keys has no key"},
		{"PrefixEmpty", []Rule{Prefix(4, "")}, "rule 0: it matches no key"},
		{"MatchNil", []Rule{Match(4, nil)}, "rule 0: it matches no key"},
		{"TwoKinds", []Rule{{keys: []string{"a"}, prefix: "b", n: 4}}, "rule 0: it has more than one of keys, prefix and match"},
		{"NTooSmall", []Rule{ok, Keys(1, "a")}, "rule 1: n must be between 2 and 64 sub-buckets, got 1"},
		{"NTooLarge", []Rule{Prefix(65, "a")}, "rule 0: n must be between 2 and 64 sub-buckets, got 65"},
		{"RetriesNegative", []Rule{Keys(4, "a").WithRetries(-1)}, "rule 0: WithRetries must be between 0 and n-1 (3), got -1"},
		{"RetriesN", []Rule{ok, Prefix(2, "p"), Match(4, func(string) bool { return false }).WithRetries(4)}, "rule 2: WithRetries must be between 0 and n-1 (3), got 4"},
		{"KeyEmpty", []Rule{Keys(4, "a", "")}, "rule 0: key 1: ratelimit: invalid key: sharding: the key is empty"},
		{"KeyTooLong", []Rule{Keys(4, strings.Repeat("k", ratelimit.MaxKeyLen+1))}, "rule 0: key 0: ratelimit: invalid key: sharding: key of 513 bytes is longer than a key may be, 512"},
		{"PrefixTooLong", []Rule{Prefix(4, strings.Repeat("k", ratelimit.MaxKeyLen+1))}, "rule 0: Prefix is 513 bytes; a key may have at most 512"},
		{"KeyTwice", []Rule{ok, Keys(4, "a", "b", "a")}, `rule 1: Keys has key "a" twice`},
		{"KeyInTwoRules", []Rule{Keys(4, "a"), ok, Keys(3, "b", "a")}, `rule 2: key "a" is rule 0's already`},
		{"KeyLikeSubKey", []Rule{Keys(4, "a"), Keys(3, "b", "a\x001.4")}, `rule 1: key "a\x001.4" has the form of a sub-bucket's key of another hot key`},
		{"KeyLikePrefixSubKey", []Rule{Prefix(4, "t:"), Keys(3, "t:x\x000.4.9")}, `rule 1: key "t:x\x000.4.9" has the form of a sub-bucket's key`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(mem, options(tt.rules)...)
			if !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), "sharding: "+tt.want) || b != nil {
				t.Errorf("New: %v, %v; want nil and ErrInvalidConfig: %q", b, err, tt.want)
			}
		})
	}
	if b, err := New(nil, ok); !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), "next Backend is nil") || b != nil {
		t.Errorf("New(nil): %v, %v; want nil and ErrInvalidConfig naming the next Backend", b, err)
	}
	if _, err := New(mem); err != nil {
		t.Errorf("New with no rules: %v", err)
	}
	// Hooks options between the rules do not count as rules.
	hooks := WithHooks(Hooks{})
	if _, err := New(mem, hooks, ok, hooks, Keys(1, "a")); err == nil || !strings.Contains(err.Error(), "sharding: rule 1: n must be") {
		t.Errorf("New(hooks, ok, hooks, bad): %v; want the bad rule named rule 1", err)
	}
	var nilRule *Rule
	for _, tt := range []struct {
		opts []Option
		want string
	}{
		{[]Option{ok, nil}, "sharding: option 1 is nil"},
		{[]Option{nilRule}, "sharding: option 0 is a nil *Rule"},
	} {
		if b, err := New(mem, tt.opts...); !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) || b != nil {
			t.Errorf("New(%v): %v, %v; want nil and ErrInvalidConfig: %q", tt.opts, b, err, tt.want)
		}
	}
	r := Keys(3, "ptr")
	if b, err := New(mem, &r); err != nil {
		t.Errorf("New(&rule): %v", err)
	} else if n := len(subKeys(t, b, "ptr")); n != 3 {
		t.Errorf("New(&rule) split its key %d ways; want 3", n)
	}
}

// TestRulePrecedence: a Keys rule's key is that rule's though a Prefix or
// Match rule matches it too; otherwise the first Prefix or Match rule in
// order that matches takes it. The rules given are copied: changing the
// caller's slice afterwards changes nothing.
func TestRulePrecedence(t *testing.T) {
	mem := newMemory(t, newClock())
	rules := []Option{Prefix(3, "api:"), Match(5, func(k string) bool { return strings.HasSuffix(k, "x") }), Keys(4, "api:x"), Prefix(6, "ap")}
	b := mustNew(t, mem, rules...)
	rules[0], rules[2] = Prefix(7, "zz"), Keys(8, "zz")
	for key, n := range map[string]int{"api:x": 4, "api:y": 3, "apx": 5, "apy": 6} {
		if got := len(subKeys(t, b, key)); got != n {
			t.Errorf("%q: split %d ways; want %d", key, got, n)
		}
	}
}

// TestSplits: Splits names the keys a rule splits, for the lease package.
func TestSplits(t *testing.T) {
	b := mustNew(t, newMemory(t, newClock()), Keys(4, "hot"), Prefix(3, "tenant:"))
	for key, want := range map[string]bool{"hot": true, "tenant:1": true, "cold": false, "hot2": false} {
		if got := b.Splits(key); got != want {
			t.Errorf("Splits(%q) = %v, want %v", key, got, want)
		}
	}
}
