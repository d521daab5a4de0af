package ratelimit

import (
	"fmt"
	"math/bits"
	"time"
)

// The accepted range. Every backend computes every value inside it exactly,
// including Lua scripts whose numbers are IEEE doubles with integers exact
// only up to 2^53: each bound below leaves every intermediate value of the
// math under 2^53.
const (
	// MaxCapacity is the largest Capacity (and InitialTokens) a bandwidth may
	// have: 2^50, about 1.1e15.
	MaxCapacity = 1 << 50
	// MaxRefillPeriod is the longest RefillPeriod: 366 days.
	MaxRefillPeriod = 366 * 24 * time.Hour
	// MaxScaled bounds a greedy bandwidth's capacity in scaled units
	// (Capacity × RefillPeriod in µs / gcd(RefillTokens, RefillPeriod in µs))
	// and the time, in µs, any bandwidth takes to fill from empty: 2^51, about
	// 71 years. See [Apply] for what scaled units are.
	MaxScaled = 1 << 51
	// MaxBandwidths is the most bandwidths one config may have.
	MaxBandwidths = 16
	// MaxIDLen is the longest bandwidth ID, in bytes.
	MaxIDLen = 64
	// MaxKeyLen is the longest bucket key, in bytes.
	MaxKeyLen = 512
	// MaxVersion is the largest [Config.Version]: 2^53 − 1, the largest
	// integer a Lua script's doubles hold exactly.
	MaxVersion = 1<<53 - 1
)

// maxHorizon bounds how far ahead, in µs, a bucket may be reserved (about 71
// years): Reserve never leaves a bandwidth that needs longer to refill. With
// the 2^51µs a bandwidth may take to fill from empty, a state's expiry stays
// within 2^52µs of now, below 2^53 for any now before 2112.
const maxHorizon = 1 << 51

// maxClock bounds the stores' clocks and AlignedStart, in µs since 1970:
// 2^52 is in the year 2112.
const maxClock = 1 << 52

// Algorithm selects how a bucket's bandwidths are enforced. Each
// [Bandwidth] reads as Capacity requests per RefillPeriod whatever the
// algorithm; docs/algorithms.md compares them, with measured memory, speed
// and burst behaviour.
type Algorithm uint8

const (
	// TokenBucket is the token bucket with Greedy, Interval or
	// IntervalAligned refill. It is the default, and supports every [Op].
	TokenBucket Algorithm = iota
	// GCRA is the generic cell rate algorithm, as in redis_rate and
	// redis-cell: a bucket keeps one theoretical arrival time per
	// bandwidth. Capacity is the burst, and RefillTokens per RefillPeriod
	// the rate; Refill must be Greedy. While the clock moves forward and
	// the config does not change, it decides exactly as a TokenBucket with
	// Greedy refill. A config change keeps each bandwidth's arrival time,
	// as redis_rate does; only ResetTokens starts afresh. It supports every
	// Op.
	GCRA
	// FixedWindow counts requests in a window of RefillPeriod that starts
	// with the first request taken after the previous window ended (with
	// IntervalAligned refill: in windows aligned to AlignedStart), and
	// admits Capacity per window. It allows up to twice Capacity across a
	// window boundary. RefillTokens must equal Capacity; Reserve is not
	// supported.
	FixedWindow
	// SlidingWindowLog keeps the time of every request taken in the last
	// RefillPeriod and admits a request only if no window of RefillPeriod
	// ending now would then hold more than Capacity: exact, with no
	// boundary burst. It stores up to Capacity timestamps per bucket (of the
	// bandwidth with the longest period), so Capacity is at most
	// [MaxLogCapacity]. RefillTokens must equal Capacity; Reserve is not
	// supported.
	SlidingWindowLog
	// SlidingWindowCounter estimates the sliding window from two fixed
	// windows aligned to the Unix epoch: the current window's count plus the
	// previous one's, weighted by how much of it the sliding window still
	// covers. Capacity × RefillPeriod in µs must be at most 2^53.
	// RefillTokens must equal Capacity; Reserve is not supported.
	SlidingWindowCounter
	// LeakyBucket is the leaky bucket as a meter (policing): each request
	// pours its tokens into a bucket of Capacity that leaks RefillTokens per
	// RefillPeriod, and is admitted at once if they fit, rejected at once
	// if not; nothing queues, so Reserve is not supported. It is the
	// continuous-state form of GCRA and decides as GCRA does.
	LeakyBucket
	numAlgorithms
)

// MaxLogCapacity is the largest Capacity of a [SlidingWindowLog] bandwidth:
// the log holds up to that many timestamps per bucket.
const MaxLogCapacity = 10000

var algorithmNames = [...]string{"TokenBucket", "GCRA", "FixedWindow", "SlidingWindowLog", "SlidingWindowCounter", "LeakyBucket"}

// String returns the algorithm's Go name.
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Supports reports whether op makes sense for the algorithm. Reserve does
// only for TokenBucket and GCRA: the window algorithms cannot lend from a
// later window, and a policing LeakyBucket never queues. [CheckRequest]
// rejects the others; [Bucket.Wait] polls instead of reserving for them.
func (a Algorithm) Supports(op Op) bool {
	if op == Reserve {
		return a == TokenBucket || a == GCRA
	}
	return a < numAlgorithms && op <= Inspect
}

// windowed reports whether the algorithm counts requests in windows, where
// a bandwidth is Capacity requests per RefillPeriod.
func (a Algorithm) windowed() bool {
	return a == FixedWindow || a == SlidingWindowLog || a == SlidingWindowCounter
}

// Config describes a bucket. It travels with every call: the backend stores
// only the bucket's state, stamped with [Config.Fingerprint].
type Config struct {
	// Algorithm is the zero value, [TokenBucket], unless set.
	Algorithm Algorithm
	// Bandwidths are the limits; a request passes only if every bandwidth
	// has the tokens, and then it takes from all. From 1 to [MaxBandwidths].
	Bandwidths []Bandwidth
	// Version orders a bucket's configs, as a plan's revisions: 0 (the
	// default) for a config that is not versioned, up to [MaxVersion].
	// A bucket keeps the version it was built or last converted for, and
	// changes forward only: a call that brings an older version than the
	// bucket holds is decided on the bucket's own, newer config, never
	// converting it back (see [Apply] for the rule). So replicas that
	// briefly disagree during a rollout, one passing version 1 and another
	// version 2, cannot create tokens by converting the bucket back and
	// forth. The version is not part of [Config.Fingerprint]: a new
	// version of the same limits keeps the bucket's tokens as they are.
	Version uint64
}

// Validate reports whether c lies in the accepted range, with an error
// wrapping [ErrInvalidConfig] that names the first bad field. It never
// panics.
func (c Config) Validate() error {
	if c.Algorithm >= numAlgorithms {
		return invalidConfig("Algorithm %v is not a known Algorithm", c.Algorithm)
	}
	if c.Version > MaxVersion {
		return invalidConfig("Version must be at most 2^53-1, got %d", c.Version)
	}
	if len(c.Bandwidths) == 0 || len(c.Bandwidths) > MaxBandwidths {
		return invalidConfig("Bandwidths must have 1 to %d entries, got %d", MaxBandwidths, len(c.Bandwidths))
	}
	for i := range c.Bandwidths {
		b := &c.Bandwidths[i]
		if err := b.validate(c.Algorithm); err != nil {
			return fmt.Errorf("%w: Bandwidths[%d].%w", ErrInvalidConfig, i, err)
		}
		if b.ID == "" {
			continue
		}
		for j := range i {
			if c.Bandwidths[j].ID == b.ID {
				return invalidConfig("Bandwidths[%d].ID %q repeats Bandwidths[%d].ID", i, b.ID, j)
			}
		}
	}
	return nil
}

func invalidConfig(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// fieldError is a validation failure of one Bandwidth field; Validate
// prefixes it with the bandwidth's index.
type fieldError string

func (e fieldError) Error() string { return string(e) }

func badField(format string, args ...any) error {
	return fieldError(fmt.Sprintf(format, args...))
}

func (b *Bandwidth) validate(alg Algorithm) error {
	if len(b.ID) > MaxIDLen {
		return badField("ID must be at most %d bytes, got %d", MaxIDLen, len(b.ID))
	}
	digits := 0
	for i := 0; i < len(b.ID); i++ {
		if !isIDByte(b.ID[i]) {
			return badField("ID %q may hold only letters, digits and -_.:", b.ID)
		}
		if '0' <= b.ID[i] && b.ID[i] <= '9' {
			digits++
		}
	}
	if digits > 0 && digits == len(b.ID) {
		return badField("ID %q must not be all digits: those name bandwidths without an ID", b.ID)
	}
	if b.Capacity < 1 || b.Capacity > MaxCapacity {
		return badField("Capacity must be between 1 and 2^50, got %d", b.Capacity)
	}
	if b.RefillPeriod < time.Microsecond || b.RefillPeriod > MaxRefillPeriod {
		return badField("RefillPeriod must be between 1µs and %v, got %v", MaxRefillPeriod, b.RefillPeriod)
	}
	if b.RefillPeriod%time.Microsecond != 0 {
		return badField("RefillPeriod must be a whole number of microseconds, got %v", b.RefillPeriod)
	}
	period := b.PeriodMicros()
	if b.RefillTokens < 1 || b.RefillTokens > period {
		return badField("RefillTokens must be between 1 and one per microsecond of RefillPeriod (%d), got %d", period, b.RefillTokens)
	}
	if b.InitialTokens != nil && (*b.InitialTokens < 0 || *b.InitialTokens > b.Capacity) {
		return badField("InitialTokens must be between 0 and Capacity (%d), got %d", b.Capacity, *b.InitialTokens)
	}
	switch b.Refill {
	case Greedy, Interval:
		if !b.AlignedStart.IsZero() {
			return badField("AlignedStart must be zero for %v refill", b.Refill)
		}
	case IntervalAligned:
		if us := b.AlignedStart.UnixMicro(); b.AlignedStart.IsZero() || us < 0 || us >= maxClock {
			return badField("AlignedStart must be set, between 1970 and 2112, for IntervalAligned refill, got %v", b.AlignedStart)
		}
	default:
		return badField("Refill %v is not a known RefillKind", b.Refill)
	}
	if err := b.validateFor(alg); err != nil {
		return err
	}
	if alg.windowed() {
		return nil // they count requests, not scaled units
	}
	return b.validateExact()
}

// validateExact rejects bandwidths whose arithmetic would leave the range
// that doubles hold exactly.
func (b *Bandwidth) validateExact() error {
	if b.Refill == Greedy {
		// Cheap sufficient test first: the scale never exceeds the period.
		if hi, lo := bits.Mul64(uint64(b.Capacity), uint64(b.PeriodMicros())); hi == 0 && lo <= MaxScaled {
			return nil
		}
		scale, _ := b.Units()
		if hi, lo := bits.Mul64(uint64(b.Capacity), uint64(scale)); hi != 0 || lo > MaxScaled {
			return badField("Capacity %d refilled greedily by %d per %v takes more than 2^51 scaled units, beyond exact arithmetic: lower Capacity, make RefillTokens divide the period, or use Interval refill",
				b.Capacity, b.RefillTokens, b.RefillPeriod)
		}
		return nil
	}
	periods := ceilDiv(b.Capacity, b.RefillTokens)
	if hi, lo := bits.Mul64(uint64(periods), uint64(b.PeriodMicros())); hi != 0 || lo > MaxScaled {
		return badField("Capacity %d refilled by %d per %v takes more than 2^51µs (71 years) to fill", b.Capacity, b.RefillTokens, b.RefillPeriod)
	}
	return nil
}

// validateFor checks what the algorithm asks of a valid bandwidth beyond
// the token bucket's rules.
func (b *Bandwidth) validateFor(alg Algorithm) error {
	switch {
	case alg == TokenBucket:
		return nil
	case (alg == GCRA || alg == LeakyBucket) && b.Refill != Greedy:
		return badField("Refill must be Greedy for %v, got %v", alg, b.Refill)
	case !alg.windowed():
		return nil
	case b.RefillTokens != b.Capacity:
		return badField("RefillTokens must equal Capacity (%d) for %v: a window admits Capacity requests per RefillPeriod, got %d", b.Capacity, alg, b.RefillTokens)
	case b.InitialTokens != nil:
		return badField("InitialTokens must be nil for %v", alg)
	case b.Refill != Greedy && !(alg == FixedWindow && b.Refill == IntervalAligned):
		return badField("Refill must be Greedy (the default) for %v, got %v", alg, b.Refill)
	case alg == SlidingWindowLog && b.Capacity > MaxLogCapacity:
		return badField("Capacity must be at most %d for SlidingWindowLog, which stores a timestamp per request, got %d", MaxLogCapacity, b.Capacity)
	case alg == SlidingWindowCounter:
		if hi, lo := bits.Mul64(uint64(b.Capacity), uint64(b.PeriodMicros())); hi != 0 || lo > maxWeighted {
			return badField("Capacity × RefillPeriod must be at most 2^53 requests·µs for SlidingWindowCounter, beyond exact arithmetic, got %d per %v", b.Capacity, b.RefillPeriod)
		}
	}
	return nil
}

// maxWeighted bounds Capacity × RefillPeriod in µs for SlidingWindowCounter,
// whose weighted counts are products of a count and a time.
const maxWeighted = 1 << 53

func isIDByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c == ':'
}

// Units returns how [Apply] counts b in a token bucket, GCRA or leaky
// bucket: scale scaled units make one token, and rate of them accrue every
// microsecond (Greedy); or scale is 1 and rate is RefillTokens, added once
// per period (Interval kinds). A backend that computes Apply elsewhere, as
// the Redis backends' scripts do, passes them along so that it needs no
// gcd. b must be valid.
func (b Bandwidth) Units() (scale, rate int64) {
	if b.Refill != Greedy {
		return 1, b.RefillTokens
	}
	period := b.PeriodMicros()
	g := gcd(b.RefillTokens, period)
	return period / g, b.RefillTokens / g
}

// Initial returns the tokens a new bucket's b holds: InitialTokens, or
// Capacity when that is nil.
func (b Bandwidth) Initial() int64 {
	if b.InitialTokens == nil {
		return b.Capacity
	}
	return *b.InitialTokens
}

// PeriodMicros returns RefillPeriod in whole microseconds.
func (b Bandwidth) PeriodMicros() int64 { return int64(b.RefillPeriod / time.Microsecond) }

// BandwidthName returns the name [Decision.Bandwidth] gives Bandwidths[i]:
// its ID, or its index when it has none; "" when i is out of range.
func (c Config) BandwidthName(i int) string {
	if i < 0 || i >= len(c.Bandwidths) {
		return ""
	}
	return bandName(c.Bandwidths, i)
}

// Fingerprint returns a stable 64-bit hash of everything in c that shapes
// a bucket (not its Version). It is the same in every process and on
// every platform, so replicas that pass the same config agree, and a plan
// change is seen as a different fingerprint.
func (c Config) Fingerprint() uint64 {
	// Each step folds two words into h with one 64×64→128-bit multiply,
	// as wyhash does: a config of one bandwidth is three multiplies.
	h := fold(fpSeed^uint64(c.Algorithm), fpK1^uint64(len(c.Bandwidths)))
	for i := range c.Bandwidths {
		b := &c.Bandwidths[i]
		for id := b.ID; id != ""; {
			var w uint64
			n := min(len(id), 8)
			for j := range n {
				w |= uint64(id[j]) << (8 * j)
			}
			h, id = fold(h^w, fpK1), id[n:]
		}
		// Initial ≤ Capacity < 2^50 leaves room above it for the ID's
		// length (≤ 64, 7 bits) and the refill kind, which delimit the ID's
		// bytes: "ab" then "c" is not "a" then "bc".
		shape := uint64(b.Initial()) | uint64(len(b.ID))<<50 | uint64(b.Refill)<<57
		h = fold(h^uint64(b.Capacity), fpK2^uint64(b.RefillTokens))
		h = fold(h^uint64(b.RefillPeriod), fpK3^shape)
		if b.Refill == IntervalAligned {
			h = fold(h^uint64(b.AlignedStart.UnixMicro()), fpK1)
		}
	}
	return h
}

// The fingerprint's constants: any fixed odd numbers with their top bit
// set, so that no field (each below 2^63) cancels one out.
const (
	fpSeed = 0xa0761d6478bd642f
	fpK1   = 0xe7037ed1a0b428db
	fpK2   = 0x8ebc6af09c88c6e3
	fpK3   = 0x9e3779b97f4a7c15
)

// fold mixes a and b into one word: the high and low halves of their
// product, xored.
func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}
