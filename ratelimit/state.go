package ratelimit

// State is a bucket's stored state: what a backend keeps between calls.
// The zero value is an absent bucket.
type State struct {
	// Fingerprint is the [Config.Fingerprint] of the config that built the
	// state.
	Fingerprint uint64
	// Algorithm is the algorithm that built the state. A state is only
	// carried over to a config of the same algorithm; a change of algorithm
	// starts the bucket afresh.
	Algorithm Algorithm
	// ExpiresAt is when, in µs, the state becomes the same as an absent
	// bucket's: when every bandwidth is full again if nothing is taken
	// meanwhile, plus, for a config with InitialTokens below Capacity, the
	// time a new bucket takes to fill (so a client that waited for a full
	// bucket finds it full rather than started afresh). [Apply] treats a
	// state as absent from then on, so a backend may drop it then (a Redis
	// key's TTL) and no backend's answer depends on when it does.
	ExpiresAt int64
	// Bands holds one entry per bandwidth of that config.
	Bands []BandState
	// Log holds, for [SlidingWindowLog], the times in µs of the tokens
	// taken within the longest RefillPeriod, oldest first, one entry per
	// token. It is nil for the other algorithms.
	Log []int64
	// Version is the [Config.Version] of the config that built the state,
	// or last converted it.
	Version uint64
	// Config is, for a Version above 0, a copy of that config: a call that
	// brings an older version is decided on it. It is nil for Version 0.
	Config   *Config
	configFP uint64 // the Fingerprint when Config was copied
}

// BandState is the state of one bandwidth. Besides the level and the time,
// it keeps what a config change needs to carry tokens over (the
// bandwidth's ID, capacity and scale) and, so that a decision needs no gcd
// and no division to refill, its rate. The fields' meanings above are a
// token bucket's; each other algorithm's file says how it uses them.
type BandState struct {
	ID       string // the bandwidth's ID
	Capacity int64  // the bandwidth's capacity, in tokens
	Scale    int64  // scaled units per token
	Rate     int64  // scaled units gained per µs (Greedy) or tokens per period (Interval kinds)
	Level    int64  // scaled units held; negative once reserved ahead
	Stamp    int64  // µs: last refill (Greedy) or start of the current period (Interval kinds)
	Prev     int64  // SlidingWindowCounter: the previous window's count
}

// Apply applies req to s under cfg at time now, in microseconds on the
// backend's clock, and returns the decision. cfg and req must have passed
// [CheckRequest], and now must lie between 0 and 2^52 µs since 1970 (the
// year 2112); Apply then never panics, and every value it computes or stores
// stays within ±2^53. A denied request, Estimate and Inspect take no
// tokens, but every op may rewrite s (refill, a new bucket, a config
// change, its expiry): a store must write s back after every call.
//
// Apply is the reference math that every backend computes. It is pure
// integer arithmetic: a greedy bandwidth of RefillTokens per RefillPeriod
// counts in scaled units, Scale = period/g of them to a token, and gains
// Rate = RefillTokens/g each microsecond, where g = gcd(RefillTokens,
// period in µs). Refill is then exact, and the wait for n tokens is
// ceil((n×Scale − Level)/Rate) µs. Interval kinds count whole tokens and add
// RefillTokens at each period boundary.
//
// The other algorithms have their own math, each in its file, called from
// here.
//
// A versioned config changes a bucket forward only (see [Config.Version]):
// a call whose config is older than the one the bucket holds, while the
// bucket has not expired, is decided on the bucket's own config, kept in
// [State.Config], as if the call had brought it. Only its Op, Tokens,
// MaxWait and Strategy are the caller's, and a Replace then changes nothing
// (it reports as Inspect does); the decision's Bandwidth names the caller's
// bandwidth that matches the binding one (by ID, or by position when
// neither has an ID), or else the caller's first. If the bucket's config is
// of another algorithm, or cannot apply the request (an Op it does not
// support, more Tokens than its smallest Capacity), the call changes
// nothing and is denied for [StaleRetry]: a stale replica picks up the new
// config within its cache's lifetime.
func Apply(s *State, cfg Config, req Request, now int64) (d Decision) {
	if s.holdsNewer(&cfg, now) {
		s.applyStale(&d, &cfg, req, now)
		return d
	}
	applyAs(&d, s, &cfg, &req, now)
	s.keepConfig(&cfg)
	return d
}

// applyAs is Apply with cfg whatever its version, deciding into d.
func applyAs(d *Decision, s *State, cfg *Config, req *Request, now int64) {
	switch cfg.Algorithm {
	case GCRA, LeakyBucket:
		applyGCRA(d, s, cfg, req, now)
	case FixedWindow:
		applyFixedWindow(d, s, cfg, req, now)
	case SlidingWindowLog:
		applyLog(d, s, cfg, req, now)
	case SlidingWindowCounter:
		applyCounter(d, s, cfg, req, now)
	default:
		applyBucket(d, s, cfg, req, now)
	}
}

// periodStart is the stamp of a bandwidth that is full at now: the
// IntervalAligned boundary at or before now, or now itself.
func periodStart(b *Bandwidth, now int64) int64 {
	if b.Refill != IntervalAligned {
		return now
	}
	start, period := b.AlignedStart.UnixMicro(), b.PeriodMicros()
	return start + floorDiv(now-start, period)*period
}

// match finds the old bandwidth a new one inherits from: the one with the
// same ID, or with no ID at the same position; -1 if none.
func match(old []BandState, id string, i int) int {
	if id == "" {
		if i < len(old) && old[i].ID == "" {
			return i
		}
		return -1
	}
	for j := range old {
		if old[j].ID == id {
			return j
		}
	}
	return -1
}

// indexNames name the bandwidths that have no ID.
var indexNames = [MaxBandwidths]string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15"}

// bandName is the bandwidth's ID, or its index when it has none.
func bandName(bws []Bandwidth, i int) string {
	if id := bws[i].ID; id != "" {
		return id
	}
	return indexNames[i]
}
