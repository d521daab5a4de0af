package harness

import (
	"context"
	crypto "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisconn"
	"github.com/sluicehq/sluice/ratelimit"
)

// Permits is a run of concurrency permits, [Spec].Permits: each goroutine
// of an instance is one client of the permits of the spec's Key under
// Concurrency, through the backend's DoPermit ([ratelimit.Permits] of it).
// Holding no permit, a goroutine acquires one, of a weight drawn from
// Weights, or, one time in Inspect, inspects the key. Holding one, it
// waits for a hold drawn from [HoldMin, HoldMax] and then releases it or,
// one time in Reacquire, acquires it again first (as a client does whose
// acquire timed out), releasing it after another hold. Each permit has a
// holder of its own, made of a random prefix of the process, the
// instance, the goroutine and the attempt that acquired it.
//
// A goroutine makes attempts of its own: goroutine g makes attempts g,
// g + Goroutines, g + 2·Goroutines and so on, so what each does at a hold
// is fixed: with Goroutines attempts before the first hold, each makes one
// call, an acquire, and those granted hold their permits across the hold.
// A goroutine's last attempt never acquires: it releases what it holds,
// or inspects, so a run whose calls all decide ends holding nothing. A
// release that fails drops the permit, as [ratelimit.Permit.Release] does,
// for its lease to end; any other call that fails changes nothing the
// goroutine holds. An acquire that failed may have been granted: the
// permit it took, if any, is held by no goroutine until its lease ends.
type Permits struct {
	// Concurrency is the limit of every call. Its Lease must outlast
	// every hold, unless the run means to lose permits.
	ratelimit.Concurrency
	// Weights are the weights an acquire draws from; empty means 1.
	Weights []int64 `json:",omitempty"`
	// HoldMin and HoldMax bound the hold before each call on a permit
	// held; 0 and 0 make none.
	HoldMin, HoldMax time.Duration
	// Reacquire and Inspect make one permit held in Reacquire acquired
	// again, and one call of a goroutine holding nothing in Inspect an
	// inspect; 0 means never.
	Reacquire, Inspect int
	// Counter, if set, is the address of a standalone redis-server, not
	// the one under test, on which the holders count the permits they
	// hold, at the key "sluice-overlap:" + Key: each adds its weight with
	// INCRBY just after its acquire returns granted, reported as
	// [PermitCall].Overlap, and takes it away with DECRBY just before it
	// releases. So the counter never exceeds the permits held, while the
	// leases outlast the holds, and a store that keeps its limit keeps it
	// at most Limit. An error of the counter ends the instance.
	Counter string `json:",omitempty"`
	// Seed makes each goroutine's draws, with its instance and goroutine.
	Seed uint64
}

// PermitCall is a permit call, as [Call].Permit reports it.
type PermitCall struct {
	// Request is what the call asked.
	Request ratelimit.PermitRequest
	// Decision is what the store decided; meaningless when the call's Err
	// is set.
	Decision ratelimit.PermitDecision
	// Reacquire says that the call is an acquire of a permit its
	// goroutine held already.
	Reacquire bool `json:",omitempty"`
	// Overlap is, for an acquire that took a permit, the overlap
	// counter's value once the holder added its weight: a count of the
	// permits held then that is never too high ([Permits].Counter). 0
	// without a counter, and for the acquires of a permit held already.
	Overlap int64 `json:",omitempty"`
}

// checkPermits checks a permits run's spec.
func checkPermits(spec Spec) error {
	p := spec.Permits
	if p == nil {
		return nil
	}
	if spec.Shard != nil || spec.Lease != nil || spec.Settle {
		return errors.New("spec: Permits with Shard, Lease or Settle: they are a bucket's")
	}
	if err := ratelimit.CheckPermit(spec.Key, p.Concurrency, ratelimit.PermitRequest{Op: ratelimit.PermitInspect}); err != nil {
		return fmt.Errorf("spec: Permits: %w", err)
	}
	for i, w := range p.Weights {
		if w < 1 || w > p.Limit {
			return fmt.Errorf("spec: Permits.Weights[%d] is %d; want 1 to the Limit, %d", i, w, p.Limit)
		}
	}
	if p.HoldMin < 0 || p.HoldMax < p.HoldMin || p.Reacquire < 0 || p.Inspect < 0 {
		return fmt.Errorf("spec: Permits: HoldMin %v, HoldMax %v, Reacquire %d, Inspect %d; want 0 ≤ HoldMin ≤ HoldMax, and no count negative",
			p.HoldMin, p.HoldMax, p.Reacquire, p.Inspect)
	}
	return nil
}

// holderPrefix starts this process's holders: 8 random bytes, so that no
// two processes share a holder on one key.
var holderPrefix = func() string {
	var b [8]byte
	_, _ = crypto.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}()

// newPermitClients returns the clients of a permits run on backend, and
// connects to its overlap counter, if it has one.
func newPermitClients(spec Spec, backend ratelimit.Backend, index int) (clients, error) {
	counter, err := newOverlapCounter(spec)
	if err != nil {
		return clients{}, err
	}
	return permitClients(spec, ratelimit.Permits(backend), counter, index), nil
}

// permitClients returns the clients of a permits run on pb, counting on
// counter.
func permitClients(spec Spec, pb ratelimit.PermitBackend, counter *overlapCounter, index int) clients {
	return clients{
		client: func(gi int) client {
			pc := &permitClient{
				spec: spec, backend: pb, counter: counter, instance: index, goroutine: gi,
				rng: rand.New(rand.NewPCG(spec.Permits.Seed, uint64(index)<<32|uint64(gi))),
			}
			return pc.call
		},
		close: counter.close,
	}
}

// permitClient is one goroutine of a permits run.
type permitClient struct {
	spec      Spec
	backend   ratelimit.PermitBackend
	counter   *overlapCounter // nil without
	instance  int
	goroutine int
	rng       *rand.Rand
	held      *heldPermit // the permit it holds; nil if none
}

// heldPermit is the permit a goroutine holds.
type heldPermit struct {
	holder     string
	weight     int64
	reacquired bool
}

// call makes attempt i; see [Permits].
func (pc *permitClient) call(o *out, g *gate, i int) (*Call, error) {
	req, hold := pc.next(i)
	time.Sleep(hold)
	if req.Op == ratelimit.PermitRelease {
		// Before the release is sent: the counter never counts a permit
		// released.
		if _, err := pc.counter.add(-req.Weight); err != nil {
			return nil, err
		}
	}
	held := pc.held != nil
	c := &Call{Instance: pc.instance, Goroutine: pc.goroutine, Attempt: i,
		Permit: &PermitCall{Request: req, Reacquire: held && req.Op == ratelimit.PermitAcquire}}
	timed(o, g, c, func(ctx context.Context) error {
		var err error
		c.Permit.Decision, err = pc.backend.DoPermit(ctx, pc.spec.Key, pc.spec.Permits.Concurrency, req)
		return err
	})
	pc.update(req, c)
	switch {
	case req.Op != ratelimit.PermitAcquire:
	case !held && pc.held != nil: // took a permit
		n, err := pc.counter.add(req.Weight)
		if err != nil {
			return nil, err
		}
		c.Permit.Overlap = n
	case held && pc.held == nil: // lost it
		if _, err := pc.counter.add(-req.Weight); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// next returns the request of attempt i, and the hold to wait before it.
func (pc *permitClient) next(i int) (ratelimit.PermitRequest, time.Duration) {
	p := pc.spec.Permits
	last := i+pc.spec.Goroutines >= pc.spec.Attempts
	if h := pc.held; h != nil {
		hold := p.HoldMin + time.Duration(pc.rng.Int64N(int64(p.HoldMax-p.HoldMin)+1))
		op := ratelimit.PermitRelease
		if !last && !h.reacquired && p.Reacquire > 0 && pc.rng.IntN(p.Reacquire) == 0 {
			op = ratelimit.PermitAcquire
		}
		return ratelimit.PermitRequest{Op: op, Holder: h.holder, Weight: h.weight}, hold
	}
	if last || p.Inspect > 0 && pc.rng.IntN(p.Inspect) == 0 {
		return ratelimit.PermitRequest{Op: ratelimit.PermitInspect}, 0
	}
	weight := int64(1)
	if len(p.Weights) > 0 {
		weight = p.Weights[pc.rng.IntN(len(p.Weights))]
	}
	holder := fmt.Sprintf("%s.i%d.g%d.a%d", holderPrefix, pc.instance, pc.goroutine, i)
	return ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: holder, Weight: weight}, 0
}

// update sets what the goroutine holds after call c of req.
func (pc *permitClient) update(req ratelimit.PermitRequest, c *Call) {
	decided, granted := c.Err == "", c.Permit.Decision.Granted
	switch {
	case req.Op == ratelimit.PermitRelease:
		pc.held = nil // released, lost, or left to its lease
	case req.Op != ratelimit.PermitAcquire:
	case pc.held == nil:
		if decided && granted {
			pc.held = &heldPermit{holder: req.Holder, weight: req.Weight}
		}
	case decided && !granted:
		pc.held = nil // its lease had ended, and the key had no room for it
	default:
		pc.held.reacquired = true
	}
}

// overlapCounter is a run's overlap counter; see [Permits].Counter. A nil
// one counts nothing.
type overlapCounter struct {
	client redis.UniversalClient
	key    string
}

// newOverlapCounter connects to spec's overlap counter, if it has one.
func newOverlapCounter(spec Spec) (*overlapCounter, error) {
	if spec.Permits.Counter == "" {
		return nil, nil
	}
	// No retries: an INCRBY sent twice would count a permit twice.
	c, _, err := redisconn.GoRedis(redisconn.Server{Addrs: []string{spec.Permits.Counter}})
	if err != nil {
		return nil, fmt.Errorf("overlap counter: %w", err)
	}
	return &overlapCounter{client: c, key: OverlapKey(spec.Key)}, nil
}

// OverlapKey is the key of the overlap counter of a permits run on key.
func OverlapKey(key string) string { return "sluice-overlap:" + key }

// add adds n to the counter and returns its value after.
func (oc *overlapCounter) add(n int64) (int64, error) {
	if oc == nil {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := oc.client.IncrBy(ctx, oc.key, n).Result()
	if err != nil {
		return 0, fmt.Errorf("overlap counter %s: INCRBY %d: %w", oc.key, n, err)
	}
	return v, nil
}

func (oc *overlapCounter) close() {
	if oc != nil {
		_ = oc.client.Close()
	}
}
