package failpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/ratelimit"
)

// nodeState is how a node of a nodeStore answers.
type nodeState uint8

const (
	healthy nodeState = iota // from memory
	failing                  // at once, with an error wrapping ErrBackendUnavailable
	stalled                  // once its context ends, with ErrTimeout, as a client that obeys deadlines does on a paused server
)

// nodeStore is a store of several nodes, and a ratelimit.NodeLocator: a
// key is on the node that node names, and each node answers as its state
// says. It counts the calls that reached each node.
type nodeStore struct {
	mem  *memory.Backend
	node func(key string) string

	mu    sync.Mutex
	state map[string]nodeState
	calls map[string]int
}

var _ ratelimit.NodeLocator = (*nodeStore)(nil)

func newNodeStore(t *testing.T, node func(key string) string) *nodeStore {
	s := &nodeStore{mem: memory.New(), node: node, state: map[string]nodeState{}, calls: map[string]int{}}
	t.Cleanup(func() { s.mem.Close() })
	return s
}

func (s *nodeStore) Node(key string) string { return s.node(key) }

func (s *nodeStore) set(node string, st nodeState) {
	s.mu.Lock()
	s.state[node] = st
	s.mu.Unlock()
}

// callsTo returns how many calls have reached node.
func (s *nodeStore) callsTo(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[node]
}

func (s *nodeStore) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	if err := s.reach(ctx, key); err != nil {
		return ratelimit.Decision{}, err
	}
	return s.mem.Do(ctx, key, cfg, req)
}

func (s *nodeStore) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	if err := s.reach(ctx, key); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	return s.mem.DoPermit(ctx, key, lim, req)
}

// reach counts a call on key that reached its node, and fails it as the
// node's state says.
func (s *nodeStore) reach(ctx context.Context, key string) error {
	node := s.node(key)
	s.mu.Lock()
	s.calls[node]++
	st := s.state[node]
	s.mu.Unlock()
	switch st {
	case failing:
		return fmt.Errorf("%w: node %q: connection refused", ratelimit.ErrBackendUnavailable, node)
	case stalled:
		<-ctx.Done()
		return fmt.Errorf("%w: node %q: %w", ratelimit.ErrTimeout, node, ctx.Err())
	}
	return nil
}

// twoNodes puts keys on nodes "a" and "b"; a key not in it is on no known
// node.
var twoNodes = map[string]string{"a1": "a", "a2": "a", "b1": "b", "b2": "b"}

func byTable(key string) string { return twoNodes[key] }

// decider returns a function that makes a decision on key with p and
// wants it Degraded or not, with calls more calls reaching key's node.
func decider(t *testing.T, p *failpolicy.Backend, s *nodeStore) func(key string, degraded bool, calls int) {
	return func(key string, degraded bool, calls int) {
		t.Helper()
		node := s.Node(key)
		before := s.callsTo(node)
		d, err := p.Do(context.Background(), key, perMinute, consume)
		if err != nil {
			t.Fatalf("%s on node %q: %v", key, node, err)
		}
		if got := s.callsTo(node) - before; d.Degraded != degraded || got != calls {
			t.Fatalf("%s on node %q: Degraded %v, %d calls reached the node; want %v, %d (breakers %v)", key, node, d.Degraded, got, degraded, calls, p.Breakers())
		}
	}
}

// wantBreakers wants p's breakers in the states of want.
func wantBreakers(t *testing.T, p *failpolicy.Backend, want map[string]failpolicy.BreakerState) {
	t.Helper()
	if got := p.Breakers(); !maps.Equal(got, want) {
		t.Fatalf("Breakers: %v; want %v", got, want)
	}
}

// changesOf returns the changes log reported for node, without the node.
func changesOf(log *hookLog, node string) []string {
	log.mu.Lock()
	defer log.mu.Unlock()
	var changes []string
	for _, c := range log.changes {
		// A node's name may hold colons (an address); a state's does not.
		n, change := "", c
		if i := strings.LastIndex(c, ":"); i >= 0 {
			n, change = c[:i], c[i+1:]
		}
		if n == node {
			changes = append(changes, change)
		}
	}
	return changes
}

// aRound is what a breaker goes through when a failed probe opens it
// again and the next probe closes it.
var aRound = []string{
	"BreakerClosed>BreakerOpen", "BreakerOpen>BreakerHalfOpen", "BreakerHalfOpen>BreakerOpen",
	"BreakerOpen>BreakerHalfOpen", "BreakerHalfOpen>BreakerClosed",
}

// TestNodeBreakers: with a backend that names each key's node, node a
// failing opens a's breaker, and a's alone: the keys on b are decided by
// the store before, during and after, and a key on no known node by the
// shared breaker. The hooks name the node; a's probe fails, then closes
// a's breaker.
func TestNodeBreakers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newNodeStore(t, byTable)
		var log hookLog
		const coolDown = time.Second
		p := newPolicy(t, s, failpolicy.Closed, failpolicy.WithBreaker(3, coolDown), failpolicy.WithHooks(log.hooks()))
		decide := decider(t, p, s)
		const closed, open = failpolicy.BreakerClosed, failpolicy.BreakerOpen

		wantBreakers(t, p, map[string]failpolicy.BreakerState{})
		decide("b1", false, 1)
		s.set("a", failing)
		for _, key := range []string{"a1", "a2", "a1"} {
			decide(key, true, 1)
			decide("b1", false, 1)
		}
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": open, "b": closed})
		if p.Breaker() != open {
			t.Errorf("Breaker: %v with a's open; want BreakerOpen", p.Breaker())
		}
		decide("a2", true, 0) // kept from a
		decide("b2", false, 1)
		decide("elsewhere", false, 1) // on no known node: the shared breaker
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": open, "b": closed, "": closed})

		time.Sleep(coolDown)
		decide("a1", true, 1) // a's probe fails
		decide("b1", false, 1)
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": open, "b": closed, "": closed})
		time.Sleep(coolDown)
		s.set("a", healthy)
		decide("a1", false, 1) // a's probe is answered
		decide("a2", false, 1)
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": closed, "b": closed, "": closed})
		if p.Breaker() != closed {
			t.Errorf("Breaker: %v; want BreakerClosed", p.Breaker())
		}

		if got := changesOf(&log, "a"); !slices.Equal(got, aRound) {
			t.Errorf("BreakerChanged for a: %v; want %v", got, aRound)
		}
		log.mu.Lock()
		defer log.mu.Unlock()
		if len(log.changes) != len(aRound) {
			t.Errorf("BreakerChanged: %v; want a's changes only", log.changes)
		}
		// 3 failures, 1 kept from the store, 1 failed probe.
		if want := []string{"a1", "a2", "a1", "a2", "a1"}; !slices.Equal(log.keys, want) {
			t.Errorf("Degraded for keys %v; want %v", log.keys, want)
		}
		if n := countIs(log.degraded, failpolicy.ErrBreakerOpen); n != 1 {
			t.Errorf("%d degraded decisions had ErrBreakerOpen; want 1", n)
		}
	})
}

// countIs returns how many of errs are err.
func countIs(errs []error, err error) int {
	n := 0
	for _, e := range errs {
		if errors.Is(e, err) {
			n++
		}
	}
	return n
}

// TestNodeBreakersStall: node a stalls, as a paused Redis master does.
// Its calls wait the deadline and open a's breaker; a key on b is decided
// by the store at once, even while a call on a is out. Each node then has
// a probe of its own: a's, stalled, is judged at its cool-down's end,
// while b's, failing and then answered, opens and closes b's breaker
// meanwhile. It runs on synctest's clock.
func TestNodeBreakersStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newNodeStore(t, byTable)
		var log hookLog
		const timeout, coolDown = 10 * time.Millisecond, 200 * time.Millisecond
		p := newPolicy(t, s, failpolicy.Open, failpolicy.WithTimeout(timeout), failpolicy.WithBreaker(2, coolDown), failpolicy.WithHooks(log.hooks()))
		decide := decider(t, p, s)
		const closed, open, halfOpen = failpolicy.BreakerClosed, failpolicy.BreakerOpen, failpolicy.BreakerHalfOpen

		s.set("a", stalled)
		// A call on a is out, waiting for its deadline, when b's key is
		// decided.
		out := make(chan ratelimit.Decision, 1)
		go func() {
			d, _ := p.Do(context.Background(), "a1", perMinute, consume)
			out <- d
		}()
		synctest.Wait() // the call on a waits in the store
		start := time.Now()
		decide("b1", false, 1)
		if d := <-out; !d.Degraded || time.Since(start) != timeout {
			t.Fatalf("the call on a: %+v after %v; want Degraded at the %v deadline", d, time.Since(start), timeout)
		}
		decide("a2", true, 1) // a's second failure opens its breaker
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": open, "b": closed})
		start = time.Now()
		decide("b2", false, 1)
		if took := time.Since(start); took != 0 {
			t.Errorf("b's key took %v with a's breaker open; want no wait", took)
		}

		s.set("b", failing)
		decide("b1", true, 1)
		decide("b2", true, 1)
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": open, "b": open})

		time.Sleep(coolDown)
		probeStart := time.Now()
		decide("a1", true, 1) // a's probe, stalled: its caller waits the deadline
		decide("a2", true, 0) // a's probe is out
		decide("b1", true, 1) // b's probe, which fails
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": halfOpen, "b": open})
		if p.Breaker() != open {
			t.Errorf("Breaker: %v with a half-open and b open; want BreakerOpen", p.Breaker())
		}
		s.set("b", healthy)
		time.Sleep(coolDown)
		synctest.Wait()
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": open, "b": open})
		decide("b1", false, 1) // b's probe is answered
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": open, "b": closed})
		if p.Breaker() != open {
			t.Errorf("Breaker: %v with a open; want BreakerOpen", p.Breaker())
		}

		s.set("a", healthy)
		time.Sleep(coolDown)
		decide("a2", false, 1) // a's probe is answered
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": closed, "b": closed})

		for _, node := range []string{"a", "b"} {
			if got := changesOf(&log, node); !slices.Equal(got, aRound) {
				t.Errorf("BreakerChanged for %s: %v; want %v", node, got, aRound)
			}
		}
		log.mu.Lock()
		defer log.mu.Unlock()
		for i, c := range log.changes {
			if c == "a:BreakerHalfOpen>BreakerOpen" && log.at[i].Sub(probeStart) != coolDown {
				t.Errorf("a's stalled probe was judged %v after it went out; want at its cool-down's end, %v", log.at[i].Sub(probeStart), coolDown)
			}
		}
	})
}

// TestNodeBreakerCap: at most MaxNodeBreakers nodes have a breaker of
// their own. A new node beyond them makes room by dropping the breakers
// that hold nothing, and keeps those that count a failure or are open;
// when none can go, or room was made less than a cool-down ago, new nodes
// share the shared breaker, and are given their own again once, a
// cool-down later, one can go.
func TestNodeBreakerCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A key "n/k" is on node n.
		s := newNodeStore(t, func(key string) string { n, _, _ := strings.Cut(key, "/"); return n })
		var log hookLog
		const coolDown = time.Second
		p := newPolicy(t, s, failpolicy.Closed, failpolicy.WithBreaker(3, coolDown), failpolicy.WithHooks(log.hooks()))
		decide := decider(t, p, s)
		const closed, open = failpolicy.BreakerClosed, failpolicy.BreakerOpen

		for i := range failpolicy.MaxNodeBreakers {
			decide(fmt.Sprintf("n%d/k", i), false, 1)
		}
		if n := len(p.Breakers()); n != failpolicy.MaxNodeBreakers {
			t.Fatalf("%d breakers; want %d", n, failpolicy.MaxNodeBreakers)
		}
		s.set("n0", failing)
		decide("n0/k", true, 1) // n0 counts a failure
		s.set("n1", failing)
		for range 3 {
			decide("n1/k", true, 1) // n1 opens
		}
		decide("new/k", false, 1)
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"n0": closed, "n1": open, "new": closed})
		decide("n0/k", true, 1)
		decide("n0/k", true, 1) // n0 kept its count: it opens at 3
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"n0": open, "n1": open, "new": closed})

		// A cool-down later, n0 and n1 are probed, and open again. Then
		// fill up with breakers that each count a failure.
		time.Sleep(coolDown)
		decide("n0/k", true, 1)
		decide("n1/k", true, 1)
		s.set("new", failing)
		decide("new/k", true, 1)
		for i := range failpolicy.MaxNodeBreakers - 3 {
			node := fmt.Sprintf("m%d", i)
			s.set(node, failing)
			decide(node+"/k", true, 1)
		}
		decide("over/k", false, 1) // none can go: the shared breaker
		states := p.Breakers()
		if _, own := states["over"]; len(states) != failpolicy.MaxNodeBreakers+1 || own || states[""] != closed {
			t.Fatalf("%d breakers, over's own %v, the shared %v; want %d, false, BreakerClosed",
				len(states), own, states[""], failpolicy.MaxNodeBreakers+1)
		}
		s.set("over", failing)
		for range 3 {
			decide("over/k", true, 1) // the shared breaker opens
		}
		decide("other/k", true, 0) // shares it
		if got := changesOf(&log, ""); !slices.Equal(got, []string{"BreakerClosed>BreakerOpen"}) {
			t.Errorf("BreakerChanged for the shared breaker: %v; want it opened", got)
		}
		s.set("m5", healthy)
		decide("m5/k", false, 1)   // m5 counts no failure now
		decide("other/k", true, 0) // but room was looked for just now

		// A cool-down later, n0's and n1's breakers have had no call since
		// their cool-downs ended, and m5's holds nothing: all three go.
		time.Sleep(coolDown)
		decide("other/k", false, 1)
		states = p.Breakers()
		for node, want := range map[string]failpolicy.BreakerState{"other": closed, "": open, "m4": closed, "new": closed} {
			if got, ok := states[node]; !ok || got != want {
				t.Errorf("Breakers[%q]: %v, %v; want %v", node, got, ok, want)
			}
		}
		for _, node := range []string{"n0", "n1", "m5"} {
			if _, ok := states[node]; ok {
				t.Errorf("Breakers[%q] is still there; want it dropped", node)
			}
		}
		if len(states) != failpolicy.MaxNodeBreakers-1 {
			t.Errorf("%d breakers; want %d: three dropped, other's and the shared one", len(states), failpolicy.MaxNodeBreakers-1)
		}
	})
}

// TestNodeBreakersConcurrent: decisions on many more nodes than
// MaxNodeBreakers, from 8 goroutines, are all decided by the healthy
// store, and the breakers stay within the cap. Run with -race.
func TestNodeBreakersConcurrent(t *testing.T) {
	s := newNodeStore(t, func(key string) string { n, _, _ := strings.Cut(key, "/"); return n })
	p := newPolicy(t, s, failpolicy.Closed, failpolicy.WithTimeout(time.Hour))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range failpolicy.MaxNodeBreakers {
				d, err := p.Do(context.Background(), fmt.Sprintf("n%d/k%d", (i*7+g*131)%(2*failpolicy.MaxNodeBreakers), g), perMinute, consume)
				if err != nil || d.Degraded {
					t.Errorf("%+v, %v; want the store's decision", d, err)
					return
				}
				if i%64 == 0 {
					if n := len(p.Breakers()); n > failpolicy.MaxNodeBreakers+1 {
						t.Errorf("%d breakers; want at most %d and the shared one", n, failpolicy.MaxNodeBreakers)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if states := p.Breakers(); len(states) > failpolicy.MaxNodeBreakers+1 || p.Breaker() != failpolicy.BreakerClosed {
		t.Errorf("%d breakers, Breaker %v; want at most %d and the shared one, BreakerClosed", len(states), p.Breaker(), failpolicy.MaxNodeBreakers)
	}
}

// capStore has every optional capability: the slot of a key is its
// length, its node "node-" and the key, and it has one master.
type capStore struct{ down }

func (capStore) Slot(key string) (int, bool) { return len(key), true }
func (capStore) Node(key string) string      { return "node-" + key }
func (capStore) Masters(context.Context) ([]ratelimit.Master, error) {
	return []ratelimit.Master{{Addr: "127.0.0.1:7000", Slots: []ratelimit.SlotRange{{First: 0, Last: ratelimit.NumSlots - 1}}}}, nil
}

// TestCapabilities: a Backend has the optional capabilities of the one it
// wraps, through any number of policies, and says it cannot tell where
// that one lacks them. Without a locator, its one breaker is the shared
// one.
func TestCapabilities(t *testing.T) {
	mem := memory.New()
	defer mem.Close()
	bare := newPolicy(t, mem, failpolicy.Open)
	slot, ok := bare.Slot("k")
	_, err := bare.Masters(context.Background())
	if slot != 0 || ok || bare.Node("k") != "" || !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("over memory: Slot %d, %v, Node %q, Masters %v; want 0, false, \"\", ErrUnsupported", slot, ok, bare.Node("k"), err)
	}
	wantBreakers(t, bare, map[string]failpolicy.BreakerState{"": failpolicy.BreakerClosed})

	inner := newPolicy(t, capStore{}, failpolicy.Open)
	for name, p := range map[string]*failpolicy.Backend{"one": inner, "two": newPolicy(t, inner, failpolicy.Closed)} {
		slot, ok := p.Slot("abc")
		masters, err := p.Masters(context.Background())
		if slot != 3 || !ok || p.Node("abc") != "node-abc" || err != nil || len(masters) != 1 || masters[0].Addr != "127.0.0.1:7000" {
			t.Errorf("%s policy over capStore: Slot %d, %v, Node %q, Masters %v, %v; want capStore's", name, slot, ok, p.Node("abc"), masters, err)
		}
	}
	// capStore's node names pick the breakers.
	p := newPolicy(t, capStore{}, failpolicy.Closed, failpolicy.WithBreaker(1, time.Hour))
	if d, err := p.Do(context.Background(), "k", perMinute, consume); err != nil || !d.Degraded {
		t.Fatalf("%+v, %v; want Degraded", d, err)
	}
	wantBreakers(t, p, map[string]failpolicy.BreakerState{"node-k": failpolicy.BreakerOpen})
}
