package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// gate is a go-redis hook that counts the FCALLs sent on the caller's
// connection (direct: their context is the caller's, marked) and by the
// client's autopipeliner (piped: it runs a batch, a lone command's too, on
// a context of its own), and holds the first direct one, and, when
// holdPipe is set, every piped one, until release is closed.
type gate struct {
	direct, piped atomic.Int64
	holdPipe      bool
	held          chan struct{} // closed once the first direct FCALL is held
	heldOnce      sync.Once
	pipeHeld      chan struct{} // receives once a piped FCALL is held
	release       chan struct{}
}

func newGate(holdPipe bool) *gate {
	return &gate{holdPipe: holdPipe, held: make(chan struct{}), pipeHeld: make(chan struct{}, 64), release: make(chan struct{})}
}

// callerMark marks the contexts the tests' callers pass.
type callerMark struct{}

// caller is a context the gate sees as a caller's.
func caller() context.Context { return context.WithValue(context.Background(), callerMark{}, true) }

func fcalls(cmds ...redis.Cmder) int64 {
	n := int64(0)
	for _, cmd := range cmds {
		if cmd.Name() == "fcall" {
			n++
		}
	}
	return n
}

// pass counts n FCALLs sent on ctx and holds them if the gate says so.
func (g *gate) pass(ctx context.Context, n int64) {
	if n == 0 {
		return
	}
	if ctx.Value(callerMark{}) == nil {
		g.piped.Add(n)
		if g.holdPipe {
			g.pipeHeld <- struct{}{}
			<-g.release
		}
		return
	}
	if g.direct.Add(n) == n {
		g.heldOnce.Do(func() { close(g.held) })
		<-g.release
	}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.pass(ctx, fcalls(cmd))
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.pass(ctx, fcalls(cmds...))
		return next(ctx, cmds)
	}
}

// wait returns what ch delivers, or fails t if nothing comes in a minute:
// a bound on a hang, never on how fast the code is.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("no %s in a minute", what)
		panic("unreachable")
	}
}

// warm makes a decision on a key of its own, which loads the library on
// the server if it lacks it: a test that counts FCALLs then counts no
// second try after "Function not found".
func warm(t *testing.T, lim *ratelimit.Limiter, cfg ratelimit.Config) {
	t.Helper()
	if _, err := lim.Allow(context.Background(), fmt.Sprint("warm", time.Now().UnixNano()), cfg); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentCallsArePipelined: while one decision is out on a
// connection of its own (held before it is sent), every other decision
// goes through the client's autopipeliner, and each is exact; with
// WithAutoPipelining(false) they all go on connections of their own.
func TestConcurrentCallsArePipelined(t *testing.T) {
	addr, _ := servers.StandaloneAddr(t)
	const others = 40
	for _, auto := range []bool{true, false} {
		t.Run(fmt.Sprintf("auto=%v", auto), func(t *testing.T) {
			g := newGate(false)
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, PoolSize: others + 4})
			defer c.Close()
			b, err := redisbackend.New(c, redisbackend.WithPrefix(t.Name()+":"), redisbackend.WithAutoPipelining(auto))
			if err != nil {
				t.Fatal(err)
			}
			lim := ratelimit.New(b)
			cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(others + 1)}}
			warm(t, lim, cfg)
			c.AddHook(g)
			key := fmt.Sprint("k", time.Now().UnixNano())
			type result struct {
				d   ratelimit.Decision
				err error
			}
			first := make(chan result, 1)
			go func() {
				d, err := lim.Allow(caller(), key, cfg)
				first <- result{d, err}
			}()
			<-g.held
			results := make(chan result, others)
			for range others {
				go func() {
					d, err := lim.Allow(caller(), key, cfg)
					results <- result{d, err}
				}()
			}
			seen := map[int64]bool{}
			for range others {
				r := wait(t, results, "decision")
				if r.err != nil || !r.d.Allowed || seen[r.d.Remaining] {
					t.Fatalf("decision %+v, %v; want each allowed, with its own Remaining", r.d, r.err)
				}
				seen[r.d.Remaining] = true
			}
			close(g.release)
			if r := wait(t, first, "decision"); r.err != nil || !r.d.Allowed || r.d.Remaining != 0 {
				t.Fatalf("the held decision: %+v, %v; want the last token", r.d, r.err)
			}
			wantPiped := int64(others)
			if !auto {
				wantPiped = 0
			}
			if g.piped.Load() != wantPiped || g.direct.Load() != 1+others-wantPiped {
				t.Fatalf("%d FCALLs pipelined and %d direct; want %d and %d", g.piped.Load(), g.direct.Load(), wantPiped, 1+others-wantPiped)
			}
		})
	}
}

// TestPipelinedCallObeysItsContext: a pipelined decision whose context
// is cancelled while its pipeline is held returns the caller's
// context.Canceled, not a store failure, and leaves the other calls to
// their replies.
func TestPipelinedCallObeysItsContext(t *testing.T) {
	addr, _ := servers.StandaloneAddr(t)
	g := newGate(true)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, PoolSize: 8})
	defer c.Close()
	b, err := redisbackend.New(c, redisbackend.WithPrefix(t.Name()+":"))
	if err != nil {
		t.Fatal(err)
	}
	lim := ratelimit.New(b)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}
	warm(t, lim, cfg)
	c.AddHook(g)
	key := fmt.Sprint("k", time.Now().UnixNano())
	errs := make(chan error, 3)
	allow := func(ctx context.Context) {
		_, err := lim.Allow(ctx, key, cfg)
		errs <- err
	}
	go allow(caller()) // held on its own connection
	<-g.held
	ctx, cancel := context.WithCancel(caller())
	go allow(ctx)
	wait(t, g.pipeHeld, "held autopipelined call")
	cancel()
	err = wait(t, errs, "return of the cancelled call")
	var netErr net.Error
	if !errors.Is(err, context.Canceled) || errors.Is(err, ratelimit.ErrBackendUnavailable) || errors.As(err, &netErr) {
		t.Fatalf("cancelled pipelined call: %v; want the caller's context.Canceled, not a store failure", err)
	}
	go allow(caller())
	close(g.release)
	for range 2 {
		if err := wait(t, errs, "decision"); err != nil {
			t.Fatalf("a call beside the cancelled one: %v", err)
		}
	}
}
