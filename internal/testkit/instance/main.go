// Command instance is one sluice client process of a distributed test run,
// started by testkit.StartInstances; it is not meant to be run by hand.
//
// Usage: instance INDEX. It reads a testkit.InstanceSpec as one JSON line
// on stdin, connects to Redis and writes {"Ready":true}; on the line "go"
// it runs the spec's goroutines, writing a testkit.InstanceLine on stdout
// as each call starts and as it returns, then {"Done":true}, and exits. If
// it cannot go on, it writes {"Fatal":"why"} and exits 1.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// out writes the lines the harness reads; each line in one write, so a kill
// never leaves half a line.
type out struct {
	mu sync.Mutex
}

func (o *out) line(l testkit.InstanceLine) {
	b, err := json.Marshal(l)
	if err != nil {
		panic(err) // every value written is plain data
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = os.Stdout.Write(append(b, '\n')) // a closed stdout means the harness is gone
}

func main() {
	var o out
	if err := run(&o); err != nil {
		o.line(testkit.InstanceLine{Fatal: err.Error()})
		os.Exit(1)
	}
	o.line(testkit.InstanceLine{Done: true})
}

func run(o *out) error {
	if len(os.Args) != 2 {
		return errors.New("usage: instance INDEX")
	}
	index, err := strconv.Atoi(os.Args[1])
	if err != nil {
		return fmt.Errorf("INDEX: %w", err)
	}
	in := bufio.NewReader(os.Stdin)
	specLine, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var spec testkit.InstanceSpec
	if err := json.Unmarshal(specLine, &spec); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	if spec.Goroutines < 1 || spec.Attempts < 0 {
		return fmt.Errorf("spec: Goroutines %d, Attempts %d", spec.Goroutines, spec.Attempts)
	}
	if len(spec.Requests) == 0 {
		spec.Requests = []ratelimit.Request{{Op: ratelimit.Consume, Tokens: 1}}
	}
	if spec.Timeout == 0 {
		spec.Timeout = 10 * time.Second
	}

	backend, closeClient, err := connect(spec)
	if err != nil {
		return err
	}
	defer closeClient()
	// A first round trip, so that connecting is not part of the run.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = backend.ping(ctx)
	cancel()
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	o.line(testkit.InstanceLine{Ready: true})

	if goLine, err := in.ReadString('\n'); err != nil || goLine != testkit.InstanceGo {
		return fmt.Errorf("waiting for go: read %q, %v", goLine, err)
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for g := range spec.Goroutines {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= spec.Attempts {
					return
				}
				o.line(testkit.InstanceLine{Call: call(o, backend, spec, index, g, i)})
			}
		})
	}
	wg.Wait()
	return nil
}

// call makes attempt i: it reports the start, and returns the call to
// report once done.
func call(o *out, b backend, spec testkit.InstanceSpec, index, g, i int) *testkit.Call {
	c := &testkit.Call{Instance: index, Goroutine: g, Attempt: i}
	ctx, cancel := context.WithTimeout(context.Background(), spec.Timeout)
	defer cancel()
	c.Start = time.Now().UnixNano()
	started := *c
	o.line(testkit.InstanceLine{Started: &started})
	d, err := b.Do(ctx, spec.Key, spec.Config, spec.Requests[i%len(spec.Requests)])
	c.End = time.Now().UnixNano()
	c.Decision = d
	if err != nil {
		c.Err = err.Error()
	}
	return c
}

// backend is a ratelimit.Backend that can also check its connection.
type backend interface {
	ratelimit.Backend
	ping(ctx context.Context) error
}

// connect builds spec's backend on a new client, set up as the Redis
// backends' docs recommend: no retries, the context's deadline obeyed.
func connect(spec testkit.InstanceSpec) (backend, func(), error) {
	if len(spec.Addrs) == 0 {
		return nil, nil, errors.New("spec: no Addrs")
	}
	switch spec.Backend {
	case testkit.BackendGoRedis, testkit.BackendRacy:
		var c redis.UniversalClient
		if spec.Cluster {
			c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: spec.Addrs, MaxRetries: -1, ContextTimeoutEnabled: true})
		} else {
			c = redis.NewClient(&redis.Options{Addr: spec.Addrs[0], MaxRetries: -1, ContextTimeoutEnabled: true})
		}
		closeClient := func() { _ = c.Close() }
		ping := func(ctx context.Context) error { return c.Ping(ctx).Err() }
		if spec.Backend == testkit.BackendRacy {
			return racy{c, ping}, closeClient, nil
		}
		b, err := redisbackend.New(c)
		if err != nil {
			closeClient()
			return nil, nil, err
		}
		return pinger{b, ping}, closeClient, nil
	case testkit.BackendRueidis:
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: spec.Addrs, ForceSingleClient: !spec.Cluster, DisableCache: true})
		if err != nil {
			return nil, nil, err
		}
		b, err := rueidisbackend.New(c)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		ping := func(ctx context.Context) error { return c.Do(ctx, c.B().Ping().Build()).Error() }
		return pinger{b, ping}, c.Close, nil
	}
	return nil, nil, fmt.Errorf("spec: Backend %q is not %q, %q or %q", spec.Backend, testkit.BackendGoRedis, testkit.BackendRueidis, testkit.BackendRacy)
}

// pinger pairs a backend with its client's PING.
type pinger struct {
	ratelimit.Backend
	pingFunc func(ctx context.Context) error
}

func (p pinger) ping(ctx context.Context) error { return p.pingFunc(ctx) }

// racy keeps a bucket's ratelimit.State as JSON in a plain key, and applies
// a request by GET, ratelimit.Apply on the local clock, then SET: a lost
// update whenever two calls overlap. It exists to show that the
// linearizability check fails on a limiter that is not atomic.
type racy struct {
	c        redis.UniversalClient
	pingFunc func(ctx context.Context) error
}

func (r racy) ping(ctx context.Context) error { return r.pingFunc(ctx) }

// Do reads, decides in Go and writes back, in three steps.
func (r racy) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	var s ratelimit.State
	stored, err := r.c.Get(ctx, "racy:"+key).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, err)
	default:
		if err := json.Unmarshal(stored, &s); err != nil {
			return ratelimit.Decision{}, err
		}
	}
	d := ratelimit.Apply(&s, cfg, req, time.Now().UnixMicro())
	state, err := json.Marshal(s)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	if err := r.c.Set(ctx, "racy:"+key, state, 0).Err(); err != nil {
		return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, err)
	}
	return d, nil
}
