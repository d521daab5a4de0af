// Command rlsload measures a server of Envoy's rate limit service: it calls
// ShouldRateLimit (envoy.service.ratelimit.v3.RateLimitService) on one gRPC
// target from -goroutines goroutines for -duration, as Envoy's rate limit
// filter would, and prints one line in the Go benchmark format for
// benchstat: decisions/s (calls completed per second, all goroutines
// together), the p50 and p99 latency of one call, and the fraction of calls
// answered OK. benchmarks/rls.sh (make bench-server) runs it against
// sluice-server and envoyproxy/ratelimit.
//
// Each call sends one descriptor, (-key, VALUE) in -domain, VALUE one of
// -keys distinct values k0, k1, ...: each goroutine walks them round robin
// from its own place in the list, and -keys 1 is one hot key. The target's
// config must give that descriptor a limit, one high enough that nearly
// every call is allowed, so that every call is one counter update:
//
//	domain: rlsbench
//	descriptors:
//	  - key: client
//	    rate_limit: {unit: second, requests_per_unit: 1000000}
//
// A server answers a descriptor that no limit matches OK without counting
// anything, so a reply whose first status lacks current_limit stops the
// run: it would measure another path. So does any call that fails; either
// way rlsload exits with status 1.
//
// Usage:
//
//	rlsload -target HOST:PORT -server NAME [-domain rlsbench] [-key client] [-keys 10000] [-goroutines 64] [-duration 5s] [-warmup 1s]
//
// prints
//
//	BenchmarkShouldRateLimit/server=NAME/keys=10k/goroutines=64	N	T ns/op	D decisions/s	P p50-µs	Q p99-µs	F ok/op
//
// where T is the run's wall time over N. All goroutines share one HTTP/2
// connection, as Envoy's calls from one worker thread do. The first call
// waits up to -wait for the server to come up; then -warmup of untimed
// calls opens the server's connections to its store and fills its pools
// before the timed run. Latencies go into a log-linear histogram per
// goroutine ([histogram]), so memory stays fixed however long the run,
// and its percentiles are within 1% of the exact ones.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// flags are the command line.
type flags struct {
	target, server, domain, key string
	keys, goroutines            int
	duration, warmup, wait      time.Duration
	timeout                     time.Duration
}

func main() {
	var f flags
	flag.StringVar(&f.target, "target", "", "the server's gRPC address, host:port (plaintext)")
	flag.StringVar(&f.server, "server", "", "the server's name in the benchmark line, e.g. sluice-redis")
	flag.StringVar(&f.domain, "domain", "rlsbench", "the domain of every call")
	flag.StringVar(&f.key, "key", "client", "the descriptor's key")
	flag.IntVar(&f.keys, "keys", 10_000, "distinct descriptor values, walked round robin; 1 is one hot key")
	flag.IntVar(&f.goroutines, "goroutines", 64, "goroutines calling at once")
	flag.DurationVar(&f.duration, "duration", 5*time.Second, "how long the timed run lasts")
	flag.DurationVar(&f.warmup, "warmup", time.Second, "how long the untimed calls before it last")
	flag.DurationVar(&f.wait, "wait", 15*time.Second, "how long the first call waits for the server")
	flag.DurationVar(&f.timeout, "timeout", 5*time.Second, "the deadline of each call")
	flag.Parse()
	if f.target == "" || !validName(f.server) || f.domain == "" || f.key == "" ||
		f.keys < 1 || f.goroutines < 1 || f.duration <= 0 || f.warmup < 0 || f.wait <= 0 || f.timeout <= 0 ||
		flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	line, err := run(f)
	if err != nil {
		log.Fatalf("rlsload: %s: %v", f.server, err)
	}
	fmt.Println(line)
}

// validName reports whether name can be a benchmark name's value: not
// empty, and without the space, slash or equals sign that would split it.
func validName(name string) bool {
	return name != "" && !strings.ContainsAny(name, " \t/=")
}

// run waits for the server, warms it up, and returns the benchmark line of
// the timed run.
func run(f flags) (string, error) {
	conn, err := grpc.NewClient(f.target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	c := &caller{
		client:   rlsv3.NewRateLimitServiceClient(conn),
		requests: requests(f.domain, f.key, f.keys),
		timeout:  f.timeout,
	}
	if err := c.waitForServer(f.wait); err != nil {
		return "", err
	}
	if f.warmup > 0 {
		if _, err := c.load(f.goroutines, f.warmup); err != nil {
			return "", fmt.Errorf("warm-up: %w", err)
		}
	}
	r, err := c.load(f.goroutines, f.duration)
	if err != nil {
		return "", err
	}
	name := fmt.Sprintf("BenchmarkShouldRateLimit/server=%s/keys=%s/goroutines=%d", f.server, keysLabel(f.keys), f.goroutines)
	return r.line(name), nil
}

// requests returns one request per descriptor value, built once and only
// read by the calls.
func requests(domain, key string, n int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, n)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{
			Domain: domain,
			Descriptors: []*commonv3.RateLimitDescriptor{{
				Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: "k" + strconv.Itoa(i)}},
			}},
			HitsAddend: 1,
		}
	}
	return reqs
}

// keysLabel names a key count as the benchmarks module's names do: 10k
// for 10000.
func keysLabel(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// caller makes the calls of a run.
type caller struct {
	client   rlsv3.RateLimitServiceClient
	requests []*rlsv3.RateLimitRequest
	timeout  time.Duration
}

// waitForServer makes one call that waits up to wait for the connection.
func (c *caller) waitForServer(wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := c.client.ShouldRateLimit(ctx, c.requests[0], grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("the server did not answer within %v: %w", wait, err)
	}
	_, err = check(resp)
	return err
}

// result is what a run measured.
type result struct {
	calls, ok uint64
	elapsed   time.Duration
	latency   histogram
}

// line formats r in the Go benchmark format under name.
func (r *result) line(name string) string {
	micros := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return fmt.Sprintf("%s\t%d\t%.0f ns/op\t%.0f decisions/s\t%.1f p50-µs\t%.1f p99-µs\t%.5f ok/op",
		name, r.calls,
		float64(r.elapsed.Nanoseconds())/float64(r.calls),
		float64(r.calls)/r.elapsed.Seconds(),
		micros(r.latency.quantile(0.50)), micros(r.latency.quantile(0.99)),
		float64(r.ok)/float64(r.calls))
}

// load calls from goroutines goroutines until d has passed, each finishing
// the call it is in, and returns what they measured. The first failure
// stops every goroutine and is returned.
func (c *caller) load(goroutines int, d time.Duration) (*result, error) {
	var (
		wg      sync.WaitGroup
		failed  atomic.Bool
		errOnce sync.Once
		first   error
		parts   = make([]*result, goroutines)
	)
	start := time.Now()
	end := start.Add(d)
	for g := range goroutines {
		parts[g] = &result{}
		wg.Go(func() {
			if err := c.walk(parts[g], g*len(c.requests)/goroutines, end, &failed); err != nil {
				errOnce.Do(func() { first = err })
				failed.Store(true)
			}
		})
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	total := &result{elapsed: time.Since(start)}
	for _, p := range parts {
		total.calls += p.calls
		total.ok += p.ok
		total.latency.merge(&p.latency)
	}
	if total.calls == 0 {
		return nil, errors.New("no call completed")
	}
	return total, nil
}

// walk is one goroutine of a run: it calls on the requests round robin from
// index next until end or until another goroutine failed, counting into r.
func (c *caller) walk(r *result, next int, end time.Time, failed *atomic.Bool) error {
	for !failed.Load() {
		t0 := time.Now()
		if !t0.Before(end) {
			return nil
		}
		ok, err := c.call(c.requests[next])
		if err != nil {
			return err
		}
		r.latency.record(time.Since(t0))
		r.calls++
		if ok {
			r.ok++
		}
		if next++; next == len(c.requests) {
			next = 0
		}
	}
	return nil
}

// call makes one call and reports whether it was answered OK.
func (c *caller) call(req *rlsv3.RateLimitRequest) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	resp, err := c.client.ShouldRateLimit(ctx, req)
	if err != nil {
		return false, fmt.Errorf("ShouldRateLimit %s: %w", req.Descriptors[0].Entries[0].Value, err)
	}
	return check(resp)
}

// check reports whether resp is OK, and fails when its first status has no
// limit: no limit matched the descriptor, and nothing was counted.
func check(resp *rlsv3.RateLimitResponse) (bool, error) {
	if len(resp.GetStatuses()) == 0 || resp.GetStatuses()[0].GetCurrentLimit() == nil {
		return false, errors.New("the reply names no limit: the server's config has none for this domain and descriptor, so the call counted nothing")
	}
	return resp.GetOverallCode() == rlsv3.RateLimitResponse_OK, nil
}
