package redistest_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"go.uber.org/goleak"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/redistest"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tamperNow is the clock of every tampered call, in µs: the stored values
// are built around it.
const tamperNow = 1_700_000_000_000_000

type fixedClock struct{}

func (fixedClock) Now() time.Time { return time.UnixMicro(tamperNow) }

// tamperConfigs are the configs a tampered value is tried with, by
// algorithm: one bandwidth of 4 an hour (the reproductions' limit), two
// bandwidths, one with an ID, and the first at version 5, so that a stored
// state may name a config of its own.
func tamperConfigs(alg ratelimit.Algorithm) []ratelimit.Config {
	return []ratelimit.Config{
		{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(4)}},
		{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10), ratelimit.PerHour(100).WithID("hourly")}},
		{Algorithm: alg, Version: 5, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(4)}},
	}
}

// tamperInput is one tampered bucket: the algorithm and config (an index
// into tamperConfigs) of the calls on it, the op of the first, and the
// value stored under its key: a string, or with zset a sorted set encoded
// as zsetEntries reads it.
type tamperInput struct {
	alg, cfg, op uint8
	zset         bool
	value        []byte
}

// tamperEnv is a server with both clients' backends on the fixed clock,
// and a plain client for storing and dumping values.
type tamperEnv struct {
	raw      *redis.Client
	backends []ratelimit.Backend
	names    []string
	prefix   string // of every key: unique to the process and run, as a shared server ($SLUICE_REDIS_ADDR) needs
	n        int
}

func newTamperEnv(t testing.TB) *tamperEnv {
	addr, _ := servers.StandaloneAddr(t)
	raw := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { raw.Close() })
	gc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { gc.Close() })
	gb, err := redisbackend.New(gc, redisbackend.WithClock(fixedClock{}))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	rb, err := rueidisbackend.New(rc, rueidisbackend.WithClock(fixedClock{}))
	if err != nil {
		t.Fatal(err)
	}
	return &tamperEnv{raw: raw, backends: []ratelimit.Backend{gb, rb}, names: []string{"go-redis", "rueidis"},
		prefix: fmt.Sprintf("tampered:%d:%d:", os.Getpid(), time.Now().UnixNano())}
}

// outcome is what became of one tampered input on one client.
type outcome int

const (
	rejected outcome = iota // ErrKeyRejected, the key left alone
	decided                 // a decision within the limit
)

// try stores in's value under a fresh key for each backend and calls it
// twice: the first call with in's op, the second a Consume of 1 on what the
// first left. Each call must be refused with ErrKeyRejected, the key left
// as it was, or decided within the limit. It returns the first call's
// outcomes.
func (e *tamperEnv) try(t *testing.T, in tamperInput) []outcome {
	t.Helper()
	ctx := context.Background()
	alg := ratelimit.Algorithm(in.alg % 6)
	cfgs := tamperConfigs(alg)
	cfg := cfgs[int(in.cfg)%len(cfgs)]
	req := tamperRequest(alg, in.op)
	var outs []outcome
	for i, b := range e.backends {
		e.n++
		key := e.prefix + strconv.Itoa(e.n)
		rkey := redisscript.Key("", key)
		e.store(t, rkey, in)
		for call, r := range []ratelimit.Request{req, {Tokens: 1}} {
			before, _ := e.raw.Dump(ctx, rkey).Result()
			d, err := b.Do(ctx, key, cfg, r)
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("%s, %v on config %d, call %d (%+v), value %s:\n%s", e.names[i], alg, int(in.cfg)%len(cfgs), call, r, describeValue(in), fmt.Sprintf(format, args...))
			}
			if err != nil {
				if !errors.Is(err, ratelimit.ErrKeyRejected) || errors.Is(err, ratelimit.ErrBackendUnavailable) {
					fail("%v\nwant ErrKeyRejected or a decision", err)
				}
				if after, _ := e.raw.Dump(ctx, rkey).Result(); after != before {
					fail("%v, yet the key changed from %x to %x", err, before, after)
				}
				if call == 0 {
					outs = append(outs, rejected)
				}
				break
			}
			if d.Remaining > d.Limit || d.Consumed > max(r.Tokens, 0) || d.Consumed > d.Limit {
				fail("decided %+v: beyond the limit", d)
			}
			if call == 0 {
				outs = append(outs, decided)
			}
		}
	}
	return outs
}

// tamperRequest is the request op picks, among those alg supports.
func tamperRequest(alg ratelimit.Algorithm, op uint8) ratelimit.Request {
	o := ratelimit.Op(op % 8)
	if !alg.Supports(o) {
		o = ratelimit.Consume
	}
	req := ratelimit.Request{Op: o, Tokens: 1, Strategy: ratelimit.Inheritance(op / 8 % 4)}
	switch o {
	case ratelimit.Reserve:
		req.MaxWait = time.Hour
	case ratelimit.Add, ratelimit.ConsumeUpTo:
		req.Tokens = 2
	}
	return req
}

// store writes in's value at rkey, replacing what was there.
func (e *tamperEnv) store(t *testing.T, rkey string, in tamperInput) {
	t.Helper()
	ctx := context.Background()
	if !in.zset {
		if err := e.raw.Set(ctx, rkey, in.value, 0).Err(); err != nil {
			t.Fatal(err)
		}
		return
	}
	e.raw.Del(ctx, rkey)
	if zs := zsetEntries(in.value); len(zs) > 0 {
		if err := e.raw.ZAdd(ctx, rkey, zs...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// zsetEntries reads v as a sorted set's members: each a length byte, the
// member, and its score as a little-endian float64 (NaN read as 0, which
// Redis refuses); an entry cut short ends it.
func zsetEntries(v []byte) []redis.Z {
	var zs []redis.Z
	for len(v) > 0 {
		n := int(v[0])
		if len(v) < 1+n+8 {
			break
		}
		s := math.Float64frombits(binary.LittleEndian.Uint64(v[1+n:]))
		if math.IsNaN(s) {
			s = 0
		}
		zs = append(zs, redis.Z{Member: string(v[1 : 1+n]), Score: s})
		v = v[1+n+8:]
	}
	return zs
}

// zsetValue encodes a sorted set's members as zsetEntries reads them.
func zsetValue(zs []redis.Z) []byte {
	var v []byte
	for _, z := range zs {
		m := z.Member.(string)
		v = append(append(append(v, byte(len(m))), m...), binary.LittleEndian.AppendUint64(nil, math.Float64bits(z.Score))...)
	}
	return v
}

func describeValue(in tamperInput) string {
	if in.zset {
		return fmt.Sprintf("sorted set %v", zsetEntries(in.value))
	}
	return fmt.Sprintf("%x", in.value)
}

// formatOf is the first of alg's 16 format bytes in prelude.lua's layout;
// with legacy, of the token bucket's earlier layout, which it still reads.
func formatOf(alg ratelimit.Algorithm, legacy bool) int {
	if legacy && alg == ratelimit.TokenBucket {
		return redistest.LegacyFormat
	}
	return redistest.FormatOf(alg)
}

// widthOf is the fewest bytes that hold u and, in two's complement, s.
func widthOf(u, s int64) int {
	if s < 0 {
		s = -s - 1
	}
	if 2*s > u {
		u = 2 * s
	}
	w := 1
	for w < 7 && u >= 1<<(8*w) {
		w++
	}
	return w
}

// fpBytes is a fingerprint as the scripts store it.
func fpBytes(fp uint64) []byte { return binary.LittleEndian.AppendUint64(nil, fp) }

// randField is a field value of random magnitude, within bits bits, and
// negative now and then when signed.
func randField(r *rand.Rand, bits int, signed bool) int64 {
	var x int64
	switch r.IntN(5) {
	case 0:
		x = r.Int64N(3)
	case 1:
		x = r.Int64N(120)
	case 2:
		x = 3_600_000_000 + r.Int64N(1000) - 500
	default:
		x = r.Int64N(1 << (bits - 1))
	}
	if x >= 1<<(bits-1) {
		x = 1<<(bits-1) - 1
	}
	if signed && r.IntN(4) == 0 {
		x = -x
	}
	return x
}

// randExpiry is a stored expiry: near now mostly, else anywhere in 56 bits.
func randExpiry(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return r.Int64N(1 << 56)
	case 1:
		return tamperNow + r.Int64N(1<<53)
	}
	return tamperNow + r.Int64N(8_000_000_000) - 1_000_000_000
}

// randState is a well-formed state of alg for one of its configs (or a
// random fingerprint), with random field values.
func randState(r *rand.Rand, alg ratelimit.Algorithm) []byte {
	cfgs := tamperConfigs(alg)
	cfg := cfgs[r.IntN(len(cfgs))]
	fp := cfg.Fingerprint()
	if r.IntN(8) == 0 {
		fp = r.Uint64()
	}
	n := len(cfg.Bandwidths)
	if r.IntN(8) == 0 {
		n = 1 + r.IntN(3)
	}
	bands := make([]redistest.StoredBand, n)
	for i := range bands {
		b := &bands[i]
		if i < len(cfg.Bandwidths) {
			b.ID = cfg.Bandwidths[i].ID
		}
		if r.IntN(10) == 0 {
			b.ID = []string{"", "hourly", "x"}[r.IntN(3)]
		}
		b.W1, b.W2 = 1+r.IntN(7), 1+r.IntN(7)
		b.U1, b.S1 = randField(r, 8*b.W1, false), randField(r, 8*b.W1, true)
		b.U2, b.S2 = randField(r, 8*b.W2, false), randField(r, 8*b.W2, true)
		if r.IntN(2) == 0 { // the narrowest widths, as a script writes them
			b.W1, b.W2 = widthOf(b.U1, b.S1), widthOf(b.U2, b.S2)
		}
	}
	var version uint64
	var packed []byte
	if cfg.Version > 0 || r.IntN(6) == 0 {
		version = uint64(r.Int64N(10))
		other := tamperConfigs(alg)[r.IntN(len(cfgs))]
		packed = redistest.PackedBands(other)
		if r.IntN(3) == 0 {
			packed = tamperBytes(r, packed)
		}
	}
	return redistest.EncodeState(formatOf(alg, r.IntN(4) == 0), fp, randExpiry(r), bands, version, packed)
}

// tamperBytes changes a byte of v, cuts it short or adds a byte.
func tamperBytes(r *rand.Rand, v []byte) []byte {
	v = bytes.Clone(v)
	switch r.IntN(3) {
	case 0:
		if len(v) > 0 {
			v[r.IntN(len(v))] = byte(r.IntN(256))
		}
	case 1:
		v = v[:r.IntN(len(v)+1)]
	default:
		v = append(v, byte(r.IntN(256)))
	}
	return v
}

// randLog is a well-formed sliding log for one of its configs, with random
// scores, lengths and token counts (often more than the capacity).
func randLog(r *rand.Rand) []redis.Z {
	cfgs := tamperConfigs(ratelimit.SlidingWindowLog)
	cfg := cfgs[r.IntN(len(cfgs))]
	member := string(fpBytes(cfg.Fingerprint()))
	if cfg.Version > 0 {
		member += string(redistest.AppendN(nil, uint64(r.Int64N(10)), 7)) + string(byte(len(cfg.Bandwidths))) + string(redistest.PackedBands(cfg))
	}
	if r.IntN(10) == 0 {
		member = string(tamperBytes(r, []byte(member)))
	}
	tokens := r.IntN(8)
	if r.IntN(3) == 0 {
		tokens = r.IntN(120)
	}
	length, serial := int64(tokens), int64(tokens+r.IntN(5))
	if r.IntN(4) == 0 {
		length = r.Int64N(200)
	}
	if r.IntN(10) == 0 {
		serial = r.Int64N(1 << 20)
	}
	exp := float64(randExpiry(r))
	if r.IntN(10) == 0 {
		exp = r.Float64() * 1e18
	}
	zs := []redis.Z{{Member: member, Score: -1 - exp}, {Member: "", Score: float64(-1 - length - 65536*serial)}}
	for j := range tokens {
		s := float64(tamperNow - r.Int64N(7_200_000_000))
		switch r.IntN(12) {
		case 0:
			s = float64(tamperNow + r.Int64N(1<<52))
		case 1:
			s = r.Float64() * 1e17
		case 2:
			s = -r.Float64() * 3
		}
		zs = append(zs, redis.Z{Member: strconv.Itoa(j), Score: s})
	}
	return zs
}

// randInput is one input of TestTamperedState: random bytes, or a
// well-formed value with random fields, for a random algorithm.
func randInput(r *rand.Rand) tamperInput {
	in := tamperInput{alg: uint8(r.IntN(6)), cfg: uint8(r.IntN(3)), op: uint8(r.IntN(32))}
	alg := ratelimit.Algorithm(in.alg)
	switch {
	case r.IntN(5) == 0: // random bytes
		in.value = make([]byte, r.IntN(60))
		for i := range in.value {
			in.value[i] = byte(r.IntN(256))
		}
		if len(in.value) > 0 && r.IntN(2) == 0 {
			in.value[0] = byte(formatOf(alg, r.IntN(4) == 0) + r.IntN(3) + 128*r.IntN(2))
		}
		in.zset = alg == ratelimit.SlidingWindowLog && r.IntN(2) == 0
	case alg == ratelimit.SlidingWindowLog:
		in.zset, in.value = true, zsetValue(randLog(r))
	default:
		in.value = randState(r, alg)
		if r.IntN(5) == 0 {
			in.value = tamperBytes(r, in.value)
		}
	}
	return in
}

// TestTamperedState stores 2,000 values, random bytes and well-formed
// states with random fields, where a bucket of each algorithm lives, and
// calls it through both clients: every call must be refused with
// ErrKeyRejected, the key left alone, or decided within the limit. None
// may come back as ErrBackendUnavailable, which the fail policy would
// count against the whole server.
func TestTamperedState(t *testing.T) {
	e := newTamperEnv(t)
	r := rand.New(rand.NewPCG(10, 28))
	inputs := tamperSeeds()
	for len(inputs) < 2000 {
		inputs = append(inputs, randInput(r))
	}
	var counts [2]int
	for _, in := range inputs {
		for _, o := range e.try(t, in) {
			counts[o]++
		}
	}
	t.Logf("%d inputs on 2 clients: %d calls refused with ErrKeyRejected, %d decided", len(inputs), counts[rejected], counts[decided])
	if counts[rejected] == 0 || counts[decided] == 0 {
		t.Errorf("want both outcomes")
	}
}

// tamperSeeds are the reproductions: a token bucket whose stamp is
// 2^55µs ahead, and a sliding log of capacity 4 that holds 51 tokens, all
// older than its window, but says it holds 2.
func tamperSeeds() []tamperInput {
	cfg := tamperConfigs(ratelimit.TokenBucket)[0]
	hour := int64(3_600_000_000)
	scale, _ := cfg.Bandwidths[0].Units()
	farStamp := redistest.EncodeState(formatOf(ratelimit.TokenBucket, false), cfg.Fingerprint(), tamperNow+hour,
		[]redistest.StoredBand{{W1: 5, W2: 7, U1: 4, S1: 2 * scale, U2: scale, S2: -(1 << 55)}}, 0, nil)
	logCfg := tamperConfigs(ratelimit.SlidingWindowLog)[0]
	zs := []redis.Z{{Member: string(fpBytes(logCfg.Fingerprint())), Score: float64(-1 - (tamperNow + hour))}, {Member: "", Score: -1 - 2 - 65536*51}}
	for j := range 51 {
		zs = append(zs, redis.Z{Member: strconv.Itoa(j), Score: float64(tamperNow - 2*hour + int64(j))})
	}
	return []tamperInput{
		{alg: uint8(ratelimit.TokenBucket), value: farStamp},
		{alg: uint8(ratelimit.SlidingWindowLog), zset: true, value: zsetValue(zs)},
	}
}

// FuzzTamperedState is TestTamperedState's check on values the fuzzer
// makes, from the reproductions and random inputs.
func FuzzTamperedState(f *testing.F) {
	r := rand.New(rand.NewPCG(28, 10))
	seeds := tamperSeeds()
	for range 40 {
		seeds = append(seeds, randInput(r))
	}
	for _, in := range seeds {
		f.Add(in.alg, in.cfg, in.op, in.zset, in.value)
	}
	e := newTamperEnv(f)
	f.Fuzz(func(t *testing.T, alg, cfg, op uint8, zset bool, value []byte) {
		e.try(t, tamperInput{alg: alg, cfg: cfg, op: op, zset: zset, value: value})
	})
}
