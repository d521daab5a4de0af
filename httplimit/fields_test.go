package httplimit_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sfv "github.com/shogo82148/go-sfv"
	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
)

// The tests in this file read every rate-limit field with go-sfv, an RFC
// 9651 parser of its own, tested against the HTTP working group's
// structured-field tests: not with httpsfv, which writes the fields, so
// that a mistake the two share cannot pass unseen.

// maxFigure is the largest RFC 9651 Integer (Section 3.3.1).
const maxFigure = 999_999_999_999_999

// quota is one policy of a RateLimit-Policy field.
type quota struct{ q, w int64 }

// fields are the rate-limit fields of one response, as a client reads
// them.
type fields struct {
	policies map[string]quota // RateLimit-Policy, by name
	// name, r and t are the RateLimit field's single service limit; name is
	// "" when the response has none.
	name string
	r, t int64
	// The X-RateLimit trio, -1 when absent.
	xLimit, xRemaining, xReset int64
	retryAfter                 int64 // 0 when absent
}

// readFields parses h's rate-limit fields, each with the syntax
// draft-ietf-httpapi-ratelimit-headers-10 gives it, and checks that they
// agree with one another: X-RateLimit-Remaining and -Reset are the
// RateLimit field's r and t, and r is at most X-RateLimit-Limit.
func readFields(h http.Header) (fields, error) {
	f := fields{policies: map[string]quota{}, xLimit: -1, xRemaining: -1, xReset: -1}
	// Section 3: a List of String Items with an Integer q and w.
	policy, err := sfv.DecodeList(h.Values("RateLimit-Policy"))
	if err != nil {
		return f, fmt.Errorf("RateLimit-Policy %q: %v", h.Values("RateLimit-Policy"), err)
	}
	for _, item := range policy {
		name, ok := item.Value.(string)
		q, qok := item.Parameters.Get("q").(int64)
		w, wok := item.Parameters.Get("w").(int64)
		if _, dup := f.policies[name]; !ok || !qok || !wok || q < 0 || w < 1 || dup {
			return f, fmt.Errorf("RateLimit-Policy %q: item %#v is no quota policy", h.Get("RateLimit-Policy"), item)
		}
		f.policies[name] = quota{q, w}
	}
	// Section 4: a List of String Items naming a policy, with an Integer r
	// and t.
	if vs := h.Values("RateLimit"); len(vs) > 0 {
		limit, err := sfv.DecodeList(vs)
		if err != nil || len(limit) != 1 {
			return f, fmt.Errorf("RateLimit %q: %v, want one service limit", vs, err)
		}
		item := limit[0]
		name, ok := item.Value.(string)
		r, rok := item.Parameters.Get("r").(int64)
		t, tok := item.Parameters.Get("t").(int64)
		if _, named := f.policies[name]; !ok || !rok || !tok || r < 0 || t < 0 || !named {
			return f, fmt.Errorf("RateLimit %q with RateLimit-Policy %q: no service limit of a policy", vs, h.Get("RateLimit-Policy"))
		}
		f.name, f.r, f.t = name, r, t
	}
	for _, x := range []struct {
		name string
		to   *int64
	}{{"X-RateLimit-Limit", &f.xLimit}, {"X-RateLimit-Remaining", &f.xRemaining}, {"X-RateLimit-Reset", &f.xReset}, {"Retry-After", &f.retryAfter}} {
		vs := h.Values(x.name)
		if len(vs) == 0 {
			continue
		}
		item, err := sfv.DecodeItem(vs)
		n, ok := item.Value.(int64)
		if err != nil || !ok || n < 0 || item.Parameters.Len() != 0 {
			return f, fmt.Errorf("%s %q is no Integer: %v", x.name, vs, err)
		}
		*x.to = n
	}
	switch {
	case f.name == "" && (f.xLimit >= 0 || f.xRemaining >= 0 || f.xReset >= 0):
		return f, fmt.Errorf("X-RateLimit fields without a RateLimit field: %v", h)
	case f.name != "" && f.xLimit >= 0 && (f.xRemaining != f.r || f.xReset != f.t || f.r > f.xLimit):
		return f, fmt.Errorf("X-RateLimit-Limit %d, -Remaining %d, -Reset %d for RateLimit %q: not its r and t, or r above the limit",
			f.xLimit, f.xRemaining, f.xReset, h.Get("RateLimit"))
	case h.Get("Retry-After") != "" && f.retryAfter < 1:
		return f, fmt.Errorf("Retry-After %q: want at least 1", h.Get("Retry-After"))
	}
	return f, nil
}

func (c *fixedClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// limiterOn is a Limiter on a memory backend that reads clock, closed
// when the test ends, so that its sweeper does not outlive it.
func limiterOn(t testing.TB, clock *fixedClock) *ratelimit.Limiter {
	b := memory.New(memory.WithClock(clock))
	t.Cleanup(func() { _ = b.Close() })
	return ratelimit.New(b)
}

// get serves one GET through h and reads its fields.
func get(t *testing.T, h http.Handler) (int, fields) {
	t.Helper()
	rec := serve(h, httptest.NewRequest("GET", "/", nil))
	f, err := readFields(rec.Header())
	if err != nil {
		t.Fatal(err)
	}
	return rec.Code, f
}

// TestResetOfTheNamedPolicy: with several bandwidths, t is the named
// policy's own, never another's. Of a burst of 5 a second and 8 an hour,
// the burst binds first, and its next token is 200 ms away, though the
// hourly one's is 450 s; then the hourly one binds, with its own.
func TestResetOfTheNamedPolicy(t *testing.T) {
	clock := newClock()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(5).WithID("burst"), ratelimit.PerHour(8).WithID("hourly"),
	}}
	h := mustNew(t, limiterOn(t, clock), httplimit.WithConfig(cfg))(&handlerSpy{})
	want := func(status int, name string, r, tt, retry int64) {
		t.Helper()
		code, f := get(t, h)
		if code != status || f.name != name || f.r != r || f.t != tt || f.retryAfter != retry {
			t.Fatalf("%d with RateLimit %q;r=%d;t=%d, Retry-After %d; want %d with %q;r=%d;t=%d, Retry-After %d",
				code, f.name, f.r, f.t, f.retryAfter, status, name, r, tt, retry)
		}
	}
	want(http.StatusOK, "burst", 4, 1, 0)
	for r := int64(3); r >= 0; r-- {
		want(http.StatusOK, "burst", r, 1, 0)
	}
	want(http.StatusTooManyRequests, "burst", 0, 1, 1)
	// A second on, the burst is full and the hourly bandwidth has 3 and
	// 1/450 of a token: it binds, and its next token is 449 s away.
	clock.advance(time.Second)
	for r := int64(2); r >= 0; r-- {
		want(http.StatusOK, "hourly", r, 449, 0)
	}
	want(http.StatusTooManyRequests, "hourly", 0, 449, 449)
}

// TestResetWhenEmpty: t is when the named policy's next token arrives
// (the draft's "additional quota", Section 4.1.2), not when it is full
// again. Of 3 tokens and one more every 7 s, the third request leaves none
// and says t=7, and the fourth is told the same moment: Retry-After and t
// 7, then, 3 s on, 4; 4 s later a token is there.
func TestResetWhenEmpty(t *testing.T) {
	clock := newClock()
	slow := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{{ID: "slow", Capacity: 3, RefillTokens: 1, RefillPeriod: 7 * time.Second}}}
	h := mustNew(t, limiterOn(t, clock), httplimit.WithConfig(slow))(&handlerSpy{})
	for _, s := range []struct {
		advance     time.Duration
		status      int
		r, t, retry int64
	}{
		{0, http.StatusOK, 2, 7, 0},
		{0, http.StatusOK, 1, 7, 0},
		{0, http.StatusOK, 0, 7, 0},
		{0, http.StatusTooManyRequests, 0, 7, 7},
		{3 * time.Second, http.StatusTooManyRequests, 0, 4, 4},
		{4 * time.Second, http.StatusOK, 0, 7, 0},
	} {
		clock.advance(s.advance)
		code, f := get(t, h)
		if code != s.status || f.name != "slow" || f.r != s.r || f.t != s.t || f.retryAfter != s.retry {
			t.Errorf("after %v more: %d with RateLimit %q;r=%d;t=%d, Retry-After %d; want %d with \"slow\";r=%d;t=%d, Retry-After %d",
				s.advance, code, f.name, f.r, f.t, f.retryAfter, s.status, s.r, s.t, s.retry)
		}
	}
}

// TestFiguresOneRule: every figure of every field is an RFC 9651 Integer,
// 999,999,999,999,999 at most, X-RateLimit-Limit as much as the rest,
// though a Capacity reaches 2^50 (1,125,899,906,842,624).
func TestFiguresOneRule(t *testing.T) {
	huge := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1_000_000).WithBurst(ratelimit.MaxCapacity).WithID("huge")}}
	h := mustNew(t, limiterOn(t, newClock()), httplimit.WithConfig(huge))(&handlerSpy{})
	rec := serve(h, httptest.NewRequest("GET", "/", nil))
	f, err := readFields(rec.Header())
	if err != nil {
		t.Fatal(err)
	}
	if f.policies["huge"].q != maxFigure || f.r != maxFigure || f.xLimit != maxFigure || f.xRemaining != maxFigure || f.t != 1 {
		t.Errorf("q %d, r %d, t %d, X-RateLimit-Limit %d, -Remaining %d; want q, r and both X- figures %d, t 1",
			f.policies["huge"].q, f.r, f.t, f.xLimit, f.xRemaining, int64(maxFigure))
	}
}

// response is one response of a sequence: when it was sent, on the
// backend's clock, in µs, and what it said.
type response struct {
	at     int64
	status int
	f      fields
}

func (p response) String() string {
	return fmt.Sprintf("at %dµs: %d %q;r=%d;t=%d Retry-After %d", p.at, p.status, p.f.name, p.f.r, p.f.t, p.f.retryAfter)
}

// TestFieldsSequences runs checkFields on random configs and request
// sequences.
func TestFieldsSequences(t *testing.T) {
	n := uint64(400)
	if testing.Short() {
		n = 50
	}
	for seed := range n {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkFields(t, seed) })
	}
}

// FuzzFields is checkFields on configs and sequences drawn from the
// fuzzer's seeds.
func FuzzFields(f *testing.F) {
	f.Add(uint64(0))
	f.Add(uint64(7))
	f.Fuzz(checkFields)
}

// checkFields sends a sequence of requests, at random times, through the
// middleware on a random config of several bandwidths (seeded by seed), and
// checks every response:
//   - every field parses as the draft says (readFields), and a 429 has
//     r=0 and a Retry-After of t, never earlier (Section 6);
//
// and every two in a row, the earlier of which says policy P has r tokens
// and the next arrives in t s (so before then P has r, and from then on
// more):
//   - if r is 0, a request before t-1 s is refused, and is not told to come
//     back before t-1 s; and if P refuses it, the moment it is told is the
//     one t named, to within the rounding to whole seconds;
//   - a request before t-1 s that P binds leaves it r-1 when allowed, r
//     when refused; from t s on, at least r, and it is not P that refuses.
func checkFields(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x28))
	cfg := randomConfig(rng)
	clock := newClock()
	clock.advance(time.Duration(rng.Int64N(int64(time.Hour))).Truncate(time.Microsecond))
	h := mustNew(t, limiterOn(t, clock), httplimit.WithConfig(cfg))(&handlerSpy{})
	capacity := map[string]int64{}
	for i, b := range cfg.Bandwidths {
		capacity[cfg.BandwidthName(i)] = b.Capacity
	}
	var seen []response
	for range 40 {
		if len(seen) > 0 {
			clock.advance(randomGap(rng, cfg, seen[len(seen)-1].f.t))
		}
		rec := serve(h, httptest.NewRequest("GET", "/", nil))
		f, err := readFields(rec.Header())
		seen = append(seen, response{clock.Now().UnixMicro(), rec.Code, f})
		if err == nil {
			err = checkResponse(seen, capacity)
		}
		if err != nil {
			var history []string
			for _, p := range seen {
				history = append(history, "  "+p.String())
			}
			t.Fatalf("seed %d, %v: %v\nresponses:\n%s", seed, describeConfig(cfg), err, strings.Join(history, "\n"))
		}
	}
}

// checkResponse checks the last of seen, alone and after the one before.
func checkResponse(seen []response, capacity map[string]int64) error {
	c := seen[len(seen)-1]
	switch {
	case c.status != http.StatusOK && c.status != http.StatusTooManyRequests:
		return fmt.Errorf("status %d", c.status)
	case c.f.name == "":
		return fmt.Errorf("no RateLimit field")
	case c.f.xLimit != min(capacity[c.f.name], maxFigure):
		return fmt.Errorf("X-RateLimit-Limit %d, want the capacity of %q, %d, within the Integers", c.f.xLimit, c.f.name, capacity[c.f.name])
	case c.status == http.StatusOK && c.f.retryAfter != 0:
		return fmt.Errorf("Retry-After %d on a 200", c.f.retryAfter)
	case c.status == http.StatusTooManyRequests && (c.f.r != 0 || c.f.retryAfter != c.f.t):
		return fmt.Errorf("a 429 with r=%d, t=%d and Retry-After %d: want r=0 and Retry-After t", c.f.r, c.f.t, c.f.retryAfter)
	case len(seen) < 2:
		return nil
	}
	p := seen[len(seen)-2]
	const second = int64(time.Second / time.Microsecond)
	due := p.at + p.f.t*second // P has more than r from here on
	before := c.at <= due-second
	refused := c.status == http.StatusTooManyRequests
	if p.f.r == 0 {
		switch told := c.at + c.f.retryAfter*second; {
		case before && !refused:
			return fmt.Errorf("admitted before t-1 s, after r=0")
		case refused && told <= due-second:
			return fmt.Errorf("told to come back at %dµs, though t said %dµs", told, due)
		case refused && c.f.name == p.f.name && (told >= due+second):
			return fmt.Errorf("told by %q to come back at %dµs, though t said %dµs", c.f.name, told, due)
		}
	}
	if c.f.name != p.f.name || p.f.r == capacity[p.f.name] || capacity[p.f.name] > maxFigure {
		return nil // another policy, a full one, or one whose r is bounded
	}
	switch {
	case before && !refused && c.f.r != p.f.r-1, before && refused && c.f.r != p.f.r:
		return fmt.Errorf("%q has %d left before t-1 s, after r=%d", c.f.name, c.f.r, p.f.r)
	case c.at >= due && refused:
		return fmt.Errorf("%q refused from t on", c.f.name)
	case c.at >= due && c.f.r < p.f.r:
		return fmt.Errorf("%q has %d left from t on, after r=%d", c.f.name, c.f.r, p.f.r)
	}
	return nil
}

// randomGap is the time to wait before the next request, after one whose
// t was t: none, a little, or around t, where the fields change.
func randomGap(rng *rand.Rand, cfg ratelimit.Config, t int64) time.Duration {
	us := func(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
	switch k := rng.IntN(10); {
	case k < 3:
		return 0
	case k < 5:
		return us(rng.Int64N(2_000_000))
	case k < 6:
		return max(0, time.Duration(t-1)*time.Second)
	case k < 7:
		return time.Duration(t) * time.Second
	case k < 9:
		return time.Duration(t)*time.Second + us(rng.Int64N(1_000_000))
	}
	longest := time.Second
	for _, b := range cfg.Bandwidths {
		longest = max(longest, b.RefillPeriod)
	}
	return us(rng.Int64N(int64(2 * longest / time.Microsecond)))
}

// randomConfig is a valid config of one to three bandwidths of any
// algorithm, mostly small enough to run out in a few requests, now and
// then of a capacity beyond the Integers. None has InitialTokens: a bucket
// that starts below capacity starts so again once it has expired, full,
// and so holds fewer tokens later than it did, which checkFields assumes
// never happens while no request is made.
func randomConfig(rng *rand.Rand) ratelimit.Config {
	algorithms := []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.FixedWindow,
		ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter, ratelimit.LeakyBucket}
	periods := []time.Duration{300 * time.Millisecond, time.Second, 2500 * time.Millisecond, 7 * time.Second, time.Minute, time.Hour}
	ids := []string{"", "burst", "hourly", "a.b", "x-1"}
	for {
		cfg := ratelimit.Config{Algorithm: algorithms[rng.IntN(len(algorithms))]}
		for range 1 + rng.IntN(3) {
			b := ratelimit.Bandwidth{ID: ids[rng.IntN(len(ids))], Capacity: 1 + rng.Int64N(6), RefillPeriod: periods[rng.IntN(len(periods))]}
			if rng.IntN(10) == 0 {
				b.Capacity = ratelimit.MaxCapacity - rng.Int64N(1<<40)
			}
			b.RefillTokens = 1 + rng.Int64N(b.Capacity)
			if cfg.Algorithm == ratelimit.FixedWindow || cfg.Algorithm == ratelimit.SlidingWindowLog || cfg.Algorithm == ratelimit.SlidingWindowCounter {
				b.RefillTokens = b.Capacity
			}
			switch rng.IntN(4) {
			case 0:
				b.Refill = ratelimit.Interval
			case 1:
				b = b.AlignedTo(time.Date(2026, 1, 1, 0, 0, 0, rng.IntN(int(time.Second)), time.UTC).Truncate(time.Microsecond))
			}
			cfg.Bandwidths = append(cfg.Bandwidths, b)
		}
		if cfg.Validate() == nil {
			return cfg
		}
	}
}

func describeConfig(cfg ratelimit.Config) string {
	var parts []string
	for _, b := range cfg.Bandwidths {
		parts = append(parts, fmt.Sprintf("{%q %d, %d per %v %v}", b.ID, b.Capacity, b.RefillTokens, b.RefillPeriod, b.Refill))
	}
	return fmt.Sprintf("%v %s", cfg.Algorithm, strings.Join(parts, " "))
}
