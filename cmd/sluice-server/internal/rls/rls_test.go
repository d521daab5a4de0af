package rls_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rls"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlsconfig"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlstest"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
)

const (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT
)

// clock is a fake clock the tests step by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// fixture is a server of the test configs over the memory backend, on a
// fake clock that starts half a minute into a minute (so that no window
// of a minute or longer ends unless the test steps the clock).
type fixture struct {
	*rls.Server
	clock *clock
}

func newFixture(t *testing.T, files ...string) *fixture {
	t.Helper()
	cfg := rlstest.Config(t, files...)
	c := &clock{t: time.Date(2026, 12, 7, 10, 0, 30, 0, time.UTC)}
	m := memory.New(memory.WithClock(c))
	t.Cleanup(func() { _ = m.Close() })
	s, err := rls.New(cfg, rls.Options{
		Backend:         func(string, int) ratelimit.Backend { return m },
		FailModes:       rlsconfig.FailModes,
		DefaultFailMode: "open",
		Headers:         httplimit.IETFHeaders,
		Clock:           c.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{Server: s, clock: c}
}

func (f *fixture) should(t *testing.T, req *rlspb.RateLimitRequest) *rlspb.RateLimitResponse {
	t.Helper()
	resp, err := f.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// want checks a status's code, limit and remaining.
func want(t *testing.T, what string, st *rlspb.RateLimitResponse_DescriptorStatus, code rlspb.RateLimitResponse_Code, rpu uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, remaining uint32) {
	t.Helper()
	lim := st.GetCurrentLimit()
	if st.GetCode() != code || lim.GetRequestsPerUnit() != rpu || lim.GetUnit() != unit || st.GetLimitRemaining() != remaining {
		t.Errorf("%s: got %v, %d per %v, %d left; want %v, %d per %v, %d left",
			what, st.GetCode(), lim.GetRequestsPerUnit(), lim.GetUnit(), st.GetLimitRemaining(), code, rpu, unit, remaining)
	}
}

// TestBasicConfig ports the counts envoyproxy/ratelimit's integration test
// asserts on its basic and another configs (testBasicBaseConfig).
func TestBasicConfig(t *testing.T) {
	f := newFixture(t, "basic.yaml", "another.yaml")
	const (
		second = rlspb.RateLimitResponse_RateLimit_SECOND
		minute = rlspb.RateLimitResponse_RateLimit_MINUTE
		hour   = rlspb.RateLimitResponse_RateLimit_HOUR
	)

	resp := f.should(t, rlstest.Request("foo", []string{"hello", "world"}))
	if resp.OverallCode != ok || resp.Statuses[0].Code != ok || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[0].LimitRemaining != 0 {
		t.Errorf("unknown domain: got %v, want OK with no limit", resp)
	}

	resp = f.should(t, rlstest.Request("basic", []string{"key1", "foo"}))
	want(t, "key1", resp.Statuses[0], ok, 50, second, 49)

	for i := range 25 {
		resp = f.should(t, rlstest.Request("another", []string{"key2", "1234"}))
		code, left := ok, uint32(20-(i+1))
		if i >= 20 {
			code, left = over, 0
		}
		if resp.OverallCode != code {
			t.Errorf("key2 call %d: overall %v, want %v", i, resp.OverallCode, code)
		}
		want(t, "key2 call "+strconv.Itoa(i), resp.Statuses[0], code, 20, minute, left)
	}

	// Two descriptors in one request: each is counted on its own.
	for i := range 15 {
		resp = f.should(t, rlstest.Request("another", []string{"key2", "5678"}, []string{"key3", "5678"}))
		code, left3 := ok, uint32(10-(i+1))
		if i >= 10 {
			code, left3 = over, 0
		}
		if resp.OverallCode != code {
			t.Errorf("key2+key3 call %d: overall %v, want %v", i, resp.OverallCode, code)
		}
		want(t, "key2 of call "+strconv.Itoa(i), resp.Statuses[0], ok, 20, minute, uint32(20-(i+1)))
		want(t, "key3 of call "+strconv.Itoa(i), resp.Statuses[1], code, 10, hour, left3)
	}

	// duration_until_reset counts down.
	first := f.should(t, rlstest.Request("another", []string{"key4", "durTest"})).Statuses[0].DurationUntilReset.AsDuration()
	f.clock.advance(2 * time.Second)
	second2 := f.should(t, rlstest.Request("another", []string{"key4", "durTest"})).Statuses[0].DurationUntilReset.AsDuration()
	if second2 >= first || second2 <= 0 {
		t.Errorf("duration_until_reset %v, then %v 2s later: want it smaller", first, second2)
	}
}

// call is one request of envoyproxy/ratelimit's integration scripts,
// which Envoy's example proxy config turns into descriptors, and whether
// the script asserts it passes.
type call struct {
	descs [][]string
	pass  bool
}

// run makes the calls in turn, in domain rl of the example config.
func run(t *testing.T, f *fixture, script string, calls []call) {
	t.Helper()
	for i, c := range calls {
		resp := f.should(t, rlstest.Request("rl", c.descs...))
		if got := resp.OverallCode == ok; got != c.pass {
			t.Errorf("%s, call %d %v: passed %t, want %t (%v)", script, i, c.descs, got, c.pass, resp.Statuses)
		}
	}
}

// twoheader, fourheader and fiveheader are the descriptors of the example
// proxy's routes of those names for the given headers.
func twoheader(foo, bar string) [][]string { return [][]string{{"foo", foo, "bar", bar}} }

func fourheader(foo, bar, src, dst string) [][]string {
	return [][]string{{"foo", foo, "bar", bar}, {"source_cluster", src, "destination_cluster", dst}}
}

func fiveheader(foo, bar, src, dst, category string) [][]string {
	return append(fourheader(foo, bar, src, dst), []string{"category", category})
}

// TestReplaces ports envoyproxy/ratelimit's integration-test/scripts/replaces.sh.
func TestReplaces(t *testing.T) {
	f := newFixture(t, "example.yaml")
	run(t, f, "replaces increases the limit", []call{
		{twoheader("bkthomps", "banned"), false},
		{fourheader("bkthomps", "banned", "proxy", "mock"), false},
		{fourheader("bkthomps", "banned", "proxy", "override"), true},
		{fourheader("bkthomps", "banned", "proxy", "override"), true},
		{fourheader("bkthomps", "banned", "proxy", "override"), false},
	})
	run(t, f, "replaces leaves the original limit", []call{
		{fourheader("my_foo", "bkthomps", "proxy", "bkthomps"), true},
		{fourheader("my_foo", "bkthomps", "proxy", "bkthomps"), true},
		{fourheader("my_foo", "bkthomps", "proxy", "bkthomps"), false},
		{fourheader("my_foo", "bkthomps", "proxy", "not_bkthomps"), true},
		{fourheader("my_foo", "bkthomps", "proxy", "not_bkthomps"), false},
		{fourheader("my_foo", "bkthomps", "proxy", "bkthomps"), false},
	})
	f.clock.advance(time.Minute) // the scripts run a minute apart
	run(t, f, "replaces replaces several", []call{
		{fiveheader("my_foo", "bkthomps", "proxy", "fake", "account"), true},
		{fiveheader("my_foo", "bkthomps", "proxy", "fake", "account"), true},
		{fiveheader("my_foo", "bkthomps", "proxy", "fake", "account"), true},
		{fiveheader("my_foo", "bkthomps", "proxy", "fake", "account"), true},
		{fiveheader("my_foo", "bkthomps", "proxy", "fake", "account"), false},
		{twoheader("foo_2", "bkthomps"), true},
		{twoheader("foo_2", "bkthomps"), false},
		{fourheader("foo_3", "bar_3", "proxy", "fake"), true},
		{fourheader("foo_3", "bar_3", "proxy", "fake"), true},
		{fourheader("foo_3", "bar_3", "proxy", "fake"), false},
		{fiveheader("my_foo", "bkthomps", "proxy", "fake", "account"), false},
	})
}

// TestShadowAndTrigger ports trigger-ratelimit.sh and
// trigger-shadow-mode-key.sh: 3 a minute, and the same in shadow mode,
// which is never refused.
func TestShadowAndTrigger(t *testing.T) {
	f := newFixture(t, "example.yaml")
	baz := func(v string) [][]string { return [][]string{{"foo", "pelle", "baz", v}} }
	run(t, f, "trigger-ratelimit", []call{
		{baz("not-so-shady"), true}, {baz("not-so-shady"), true}, {baz("not-so-shady"), true},
		{baz("not-so-shady"), false}, {baz("not-so-shady"), false},
	})
	run(t, f, "trigger-shadow-mode-key", []call{
		{baz("shady"), true}, {baz("shady"), true}, {baz("shady"), true}, {baz("shady"), true}, {baz("shady"), true},
	})
	// The shadow limit is still counted: its status says 0 left.
	st := f.should(t, rlstest.Request("rl", baz("shady")...)).Statuses[0]
	if st.Code != ok || st.LimitRemaining != 0 {
		t.Errorf("shadow limit past its 3: got %v, %d left; want OK, 0 left", st.Code, st.LimitRemaining)
	}
}

// TestHitsAddend checks the cost of a call: the request's hits_addend, a
// descriptor's own, 0 (which looks without taking), and more than the
// limit (over, and nothing taken).
func TestHitsAddend(t *testing.T) {
	f := newFixture(t, "another.yaml") // key2: 20 a minute
	req := rlstest.Request("another", []string{"key2", "h"})
	req.HitsAddend = 5
	want(t, "5 hits", f.should(t, req).Statuses[0], ok, 20, rlspb.RateLimitResponse_RateLimit_MINUTE, 15)
	req.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	want(t, "0 hits", f.should(t, req).Statuses[0], ok, 20, rlspb.RateLimitResponse_RateLimit_MINUTE, 15)
	req.Descriptors[0].HitsAddend = wrapperspb.UInt64(21)
	want(t, "21 hits", f.should(t, req).Statuses[0], over, 20, rlspb.RateLimitResponse_RateLimit_MINUTE, 0)
	req.Descriptors[0].HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	want(t, "2^64-1 hits", f.should(t, req).Statuses[0], over, 20, rlspb.RateLimitResponse_RateLimit_MINUTE, 0)
	req.Descriptors[0].HitsAddend = wrapperspb.UInt64(15)
	want(t, "the last 15", f.should(t, req).Statuses[0], ok, 20, rlspb.RateLimitResponse_RateLimit_MINUTE, 0)
	req.Descriptors[0].HitsAddend = nil
	req.HitsAddend = 0 // 1
	want(t, "1 more", f.should(t, req).Statuses[0], over, 20, rlspb.RateLimitResponse_RateLimit_MINUTE, 0)
}

// TestBlockedAndUnlimited checks a limit of 0 per unit (always over,
// until the unit's window ends) and an unlimited one.
func TestBlockedAndUnlimited(t *testing.T) {
	f := newFixture(t, "example.yaml")
	st := f.should(t, rlstest.Request("rl", twoheader("x", "banned")...)).Statuses[0]
	if st.Code != over || st.CurrentLimit.GetRequestsPerUnit() != 0 || st.DurationUntilReset.AsDuration() != 30*time.Second {
		t.Errorf("banned: got %v, want over with 0 per minute, reset in 30s", st)
	}
	st = f.should(t, rlstest.Request("rl", []string{"qux", "any"})).Statuses[0]
	if st.Code != ok || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
		t.Errorf("unlimited: got %v, want OK with 2^32-1 left and no limit", st)
	}
}

// TestHeaders checks the draft-10 fields of the binding descriptor: the
// one over its limit, else the one with the fewest left.
func TestHeaders(t *testing.T) {
	f := newFixture(t, "another.yaml")
	headers := func(resp *rlspb.RateLimitResponse) map[string]string {
		h := map[string]string{}
		for _, hv := range resp.ResponseHeadersToAdd {
			h[hv.Key] = hv.Value
		}
		return h
	}
	h := headers(f.should(t, rlstest.Request("another", []string{"key2", "a"}, []string{"key3", "a"})))
	if h["Ratelimit"] != `"0";r=9;t=3570` || h["Ratelimit-Policy"] != `"0";q=10;w=3600` {
		t.Errorf("allowed: headers %v, want key3's (9 of 10 an hour left, the window ends in 3570s)", h)
	}
	for range 9 {
		f.should(t, rlstest.Request("another", []string{"key3", "a"}))
	}
	h = headers(f.should(t, rlstest.Request("another", []string{"key2", "a"}, []string{"key3", "a"})))
	if h["Ratelimit"] != `"0";r=0;t=3570` || h["Retry-After"] != "3570" {
		t.Errorf("over: headers %v, want key3's with r=0 and a Retry-After", h)
	}
}

// TestBadRequests checks that a request without a domain or descriptors
// is InvalidArgument, and that the caller's own end is its own code.
func TestBadRequests(t *testing.T) {
	f := newFixture(t, "another.yaml")
	for _, req := range []*rlspb.RateLimitRequest{
		{Descriptors: rlstest.Request("d", []string{"k", "v"}).Descriptors},
		{Domain: "another"},
	} {
		if _, err := f.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: got %v, want InvalidArgument", req, err)
		}
	}

	cfg := rlstest.Config(t, "another.yaml")
	s, err := rls.New(cfg, rls.Options{
		Backend:         func(string, int) ratelimit.Backend { return ctxBackend{} },
		FailModes:       rlsconfig.FailModes,
		DefaultFailMode: "error",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.ShouldRateLimit(ctx, rlstest.Request("another", []string{"key2", "x"})); status.Code(err) != codes.Canceled {
		t.Errorf("canceled caller: got %v, want Canceled", err)
	}
	if _, err := s.ShouldRateLimit(context.Background(), rlstest.Request("another", []string{"key2", "x"})); status.Code(err) != codes.Unavailable {
		t.Errorf("failing store: got %v, want Unavailable", err)
	}
}

// ctxBackend fails every call: with the context's error when it has ended,
// else as a store that is away.
type ctxBackend struct{}

func (ctxBackend) Do(ctx context.Context, _ string, _ ratelimit.Config, _ ratelimit.Request) (ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	return ratelimit.Decision{}, errors.Join(ratelimit.ErrBackendUnavailable, errors.New("connection refused"))
}

// TestSetConfig checks that a config the server cannot serve is refused
// and the old one stays.
func TestSetConfig(t *testing.T) {
	f := newFixture(t, "another.yaml")
	old := f.Config()
	bad, err := rlsconfig.Parse(rlsconfig.Source{Name: "p.yaml", Data: []byte("domain: p\ndescriptors:\n  - key: k\n    rate_limit: {plan: true}\n")})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetConfig(bad); err == nil || f.Config() != old {
		t.Errorf("a plan limit without a plan store: got %v, config swapped %t", err, f.Config() != old)
	}
}

// TestQuota ports envoyproxy/ratelimit's integration-test/scripts/quota.sh
// on its example config: two quota_mode limits of 1 and 2 a minute refuse
// a request only once both are over, until the minute ends.
func TestQuota(t *testing.T) {
	f := newFixture(t, "example.yaml")
	quota := [][]string{{"service", "service_1"}, {"service", "service_2"}}
	run(t, f, "quota.sh", []call{{quota, true}, {quota, true}, {quota, false}})
	f.clock.advance(time.Minute)
	run(t, f, "quota.sh, a minute later", []call{{quota, true}})
}

// TestQuotaModes ports envoyproxy/ratelimit's service tests of quota mode:
// a limit that is not a quota refuses on its own; quotas refuse together.
func TestQuotaModes(t *testing.T) {
	for _, c := range []struct {
		name    string
		exhaust []string // descriptors taken to their limit first
		descs   [][]string
		pass    bool
	}{
		{"all quotas over", []string{"quota", "quota2"}, [][]string{{"quota", "x"}, {"quota2", "x"}}, false},
		{"some quotas over", []string{"quota"}, [][]string{{"quota", "x"}, {"quota2", "x"}}, true},
		{"a limit over, a quota not", []string{"regular"}, [][]string{{"regular", "x"}, {"quota", "x"}}, false},
		{"a quota over, a limit not: every quota over", []string{"quota"}, [][]string{{"regular", "x"}, {"quota", "x"}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, "quota.yaml")
			for _, k := range c.exhaust {
				f.should(t, rlstest.Request("quota-domain", []string{k, "x"}))
			}
			if got := f.should(t, rlstest.Request("quota-domain", c.descs...)).OverallCode == ok; got != c.pass {
				t.Errorf("passed %t, want %t", got, c.pass)
			}
		})
	}
}

// TestDynamicMetadata ports envoyproxy/ratelimit's metadata tests: with
// quota mode for all and dynamic metadata on, the response carries the
// metadata of the descriptors that passed, merged, the first value of a
// key winning.
func TestDynamicMetadata(t *testing.T) {
	cfg := rlstest.Config(t, "quota.yaml")
	m := memory.New()
	t.Cleanup(func() { _ = m.Close() })
	s, err := rls.New(cfg, rls.Options{
		Backend:         func(string, int) ratelimit.Backend { return m },
		FailModes:       rlsconfig.FailModes,
		DefaultFailMode: "error",
		QuotaMode:       true,
		DynamicMetadata: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{Server: s}
	req := rlstest.Request("quota-domain", []string{"regular", "x"}, []string{"quota", "x"}, []string{"quota2", "x"})
	req.HitsAddend = 1
	meta := f.should(t, req).DynamicMetadata
	got := meta.GetFields()["metadata"].GetStructValue().GetFields()
	if got["name"].GetStringValue() != "service_1" || got["some_other_name"].GetStringValue() != "service_3" {
		t.Errorf("all passed: metadata %v, want name service_1 (the first) and some_other_name service_3", got)
	}
	if meta.GetFields()["domain"].GetStringValue() != "quota-domain" || len(meta.GetFields()["descriptors"].GetListValue().GetValues()) != 3 ||
		meta.GetFields()["hitsAddend"].GetNumberValue() != 1 {
		t.Errorf("dynamic metadata %v", meta)
	}
	// With regular (1 a minute) over for other values, its metadata goes
	// and quota's is the first.
	f.should(t, rlstest.Request("quota-domain", []string{"regular", "y"}))
	resp := f.should(t, rlstest.Request("quota-domain", []string{"regular", "y"}, []string{"quota", "y"}, []string{"quota2", "y"}))
	got = resp.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()
	if resp.OverallCode != ok || got["name"].GetStringValue() != "service_2" {
		t.Errorf("regular over: %v, metadata %v; want OK (quotas) and name service_2", resp.OverallCode, got)
	}
}
