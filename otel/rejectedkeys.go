package otel

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// MetricRejectedKeys is a gauge of how many distinct keys had a request
// rejected in the last whole minute of the wall clock, by [AttrKeyClass]
// and [AttrRoute]: few keys and many rejections is abuse, many keys is a
// limit set too low. It is an estimate, a HyperLogLog sketch of the keys'
// hashes (no key is kept), within about 3% (its standard error; exact up
// to a few dozen keys).
const MetricRejectedKeys = "sluice.rate_limit.rejected_keys"

// maxKeySketches bounds the key class and route pairs whose rejected
// keys are counted; rejections of pairs beyond it are not.
const maxKeySketches = 256

// sketchBits is the HyperLogLog's precision: 2^sketchBits registers of a
// byte each, a kilobyte per minute and pair, for a standard error of
// 1.04/√1024 ≈ 3.3%.
const (
	sketchBits      = 10
	sketchRegisters = 1 << sketchBits
)

// rejectedKeys counts the distinct keys rejected, per key class and route
// and per minute.
type rejectedKeys struct {
	seed     maphash.Seed
	sketches *boundedMap[pairKey, *keySketch]
}

type pairKey struct{ class, route string }

// keySketch is a pair's sketches of this minute and the last, in the
// slots of their minutes' parity.
type keySketch struct {
	attrs  metric.ObserveOption
	mu     sync.Mutex // turns a slot over to a new minute
	minute [2]atomic.Int64
	// regs packs four registers a word, so that a register is raised
	// with a compare-and-swap and the sketch takes a kilobyte.
	regs [2][sketchRegisters / 4]atomic.Uint32
}

func newRejectedKeys(m metric.Meter) *rejectedKeys {
	r := &rejectedKeys{seed: maphash.MakeSeed(), sketches: newBoundedMap[pairKey, *keySketch](maxKeySketches)}
	_, err := m.Int64ObservableGauge(MetricRejectedKeys,
		metric.WithDescription("Distinct keys with a rejected request in the last whole minute, estimated."),
		metric.WithUnit("{key}"),
		metric.WithInt64Callback(r.observe))
	if err != nil {
		otel.Handle(err)
	}
	return r
}

// add counts key, of class and route, as rejected at now.
func (r *rejectedKeys) add(class, route, key string, now time.Time) {
	s := r.sketch(pairKey{class, route})
	if s == nil {
		return
	}
	s.add(maphash.String(r.seed, key), minuteOf(now))
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// sketch returns the pair's sketch, made if need be, or nil when there are
// maxKeySketches pairs already.
func (r *rejectedKeys) sketch(k pairKey) *keySketch {
	s, _ := r.sketches.load(k, k.newSketch)
	return s
}

func (k pairKey) newSketch() *keySketch {
	kvs := make([]attribute.KeyValue, 0, 2)
	if k.class != "" {
		kvs = append(kvs, AttrKeyClass.String(k.class))
	}
	if k.route != "" {
		kvs = append(kvs, AttrRoute.String(k.route))
	}
	s := &keySketch{attrs: metric.WithAttributeSet(attribute.NewSet(kvs...))}
	for i := range s.minute {
		s.minute[i].Store(math.MinInt64)
	}
	return s
}

// observe reports each pair's estimate for the last whole minute.
func (r *rejectedKeys) observe(_ context.Context, o metric.Int64Observer) error {
	last := minuteOf(time.Now()) - 1
	for _, s := range r.sketches.all() {
		o.Observe(s.estimate(last), s.attrs)
	}
	return nil
}

// add raises the register that hash h picks, in minute's sketch.
func (s *keySketch) add(h uint64, minute int64) {
	slot := minute & 1
	if s.minute[slot].Load() != minute {
		s.turn(slot, minute)
	}
	i := h >> (64 - sketchBits)
	rank := uint32(bits.LeadingZeros64(h<<sketchBits|1<<(sketchBits-1))) + 1
	word, shift := &s.regs[slot][i/4], (i%4)*8
	for {
		old := word.Load()
		if (old>>shift)&0xff >= rank {
			return
		}
		if word.CompareAndSwap(old, old&^(0xff<<shift)|rank<<shift) {
			return
		}
	}
}

// turn empties slot for minute, unless another call has.
func (s *keySketch) turn(slot, minute int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.minute[slot].Load() >= minute {
		return
	}
	for i := range s.regs[slot] {
		s.regs[slot][i].Store(0)
	}
	s.minute[slot].Store(minute)
}

// estimate returns the distinct hashes added in minute, or 0 if that
// minute's sketch is gone or was never made.
func (s *keySketch) estimate(minute int64) int64 {
	slot := minute & 1
	if s.minute[slot].Load() != minute {
		return 0
	}
	var sum float64
	zeros := 0
	for i := range s.regs[slot] {
		w := s.regs[slot][i].Load()
		for shift := 0; shift < 32; shift += 8 {
			reg := (w >> shift) & 0xff
			if reg == 0 {
				zeros++
			}
			sum += math.Ldexp(1, -int(reg))
		}
	}
	const m = float64(sketchRegisters)
	e := 0.7213 / (1 + 1.079/m) * m * m / sum
	if e <= 2.5*m && zeros > 0 {
		// Linear counting, exact enough for the few keys where the raw
		// estimate is biased.
		e = m * math.Log(m/float64(zeros))
	}
	return int64(math.Round(e))
}
