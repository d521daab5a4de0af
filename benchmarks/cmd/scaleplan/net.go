package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/benchmarks/internal/measure"
	"github.com/sluicehq/sluice/ratelimit"
)

// counters are the server's counters net reads, and this process's CPU
// time, at one moment.
type counters struct {
	netIn, netOut, replOffset float64 // bytes
	serverCPU                 float64 // seconds
	fcalls, fcallUsec         float64
	clientCPU                 float64 // µs
}

// readCounters reads counters in one INFO round.
func readCounters(ctx context.Context, rdb *redis.Client) (counters, error) {
	in, err := readInfo(ctx, rdb, "stats", "cpu", "commandstats", "replication")
	if err != nil {
		return counters{}, err
	}
	var errs []error
	number := func(v float64, err error) float64 {
		errs = append(errs, err)
		return v
	}
	c := counters{
		netIn:      number(in.number("total_net_input_bytes")),
		netOut:     number(in.number("total_net_output_bytes")),
		replOffset: number(in.number("master_repl_offset")),
		serverCPU:  number(in.number("used_cpu_user")) + number(in.number("used_cpu_sys")),
		fcalls:     number(in.commandStat("fcall", "calls")),
		fcallUsec:  number(in.commandStat("fcall", "usec")),
		clientCPU:  float64(measure.ProcessCPU().Nanoseconds()) / 1e3,
	}
	return c, errors.Join(errs...)
}

// sub is c less d, field by field.
func (c counters) sub(d counters) counters {
	return counters{
		netIn: c.netIn - d.netIn, netOut: c.netOut - d.netOut, replOffset: c.replOffset - d.replOffset,
		serverCPU: c.serverCPU - d.serverCPU,
		fcalls:    c.fcalls - d.fcalls, fcallUsec: c.fcallUsec - d.fcallUsec,
		clientCPU: c.clientCPU - d.clientCPU,
	}
}

// measureNet prints what one decision of f.client costs on the wire, in the
// server's CPU and in this process's, at the server at addr; rdb is a
// client of that server, for INFO.
func measureNet(ctx context.Context, f flags, op op, rdb *redis.Client, addr string, cluster bool, cfg ratelimit.Config) error {
	lim, closeClient, err := newLimiter(f.client, addr, cluster, f.goroutines+4)
	if err != nil {
		return err
	}
	defer closeClient()
	var denied atomic.Int64
	decide := decider(ctx, f, op, lim, cfg, &denied)
	// Store every key and open every connection before the timed run.
	if _, err := drive(f.keys, f.goroutines, decide); err != nil {
		return err
	}
	denied.Store(0)
	a, err := readCounters(ctx, rdb)
	if err != nil {
		return err
	}
	b, err := readCounters(ctx, rdb)
	if err != nil {
		return err
	}
	took, err := drive(f.n, f.goroutines, decide)
	if err != nil {
		return err
	}
	c, err := readCounters(ctx, rdb)
	if err != nil {
		return err
	}
	round, run := b.sub(a), c.sub(b)
	calls := run.fcalls
	fmt.Printf("client=%s cluster=%v config=%s op=%s g=%d decisions=%d denied=%d fcalls=%.0f rate=%.0f/s in=%.1fB/call out=%.1fB/call repl=%.1fB/call server_cpu=%.2fus/call fcall_usec=%.2fus/call client_cpu=%.2fus/call\n",
		f.client, cluster, f.config, op.name, f.goroutines, f.n, denied.Load(), calls, float64(f.n)/took.Seconds(),
		(run.netIn-round.netIn)/calls, (run.netOut-round.netOut)/calls, run.replOffset/calls,
		run.serverCPU*1e6/calls, run.fcallUsec/calls, run.clientCPU/calls)
	return nil
}

// decider returns net's decision on the (i mod f.keys)-th key, which counts
// a denial in denied if op allows one and fails otherwise.
func decider(ctx context.Context, f flags, op op, lim *ratelimit.Limiter, cfg ratelimit.Config, denied *atomic.Int64) func(i int) error {
	if op.upTo > 0 {
		supply := func(context.Context) (ratelimit.Config, error) { return cfg, nil }
		return func(i int) error {
			key := f.userKey(i % f.keys)
			got, err := lim.Bucket(key, supply).ConsumeUpTo(ctx, op.upTo)
			if err == nil && got != op.upTo {
				err = fmt.Errorf("ConsumeUpTo on %s got %d of %d tokens", key, got, op.upTo)
			}
			return err
		}
	}
	return func(i int) error {
		key := f.userKey(i % f.keys)
		d, err := lim.Allow(ctx, key, cfg)
		if err == nil && !d.Allowed && op.anyOutcome {
			denied.Add(1)
			return nil
		}
		return allowed(d, err, key)
	}
}

// newLimiter returns a Limiter on a client of addr, and a func that closes
// the client. go-redis's is a ClusterClient on a cluster node, with
// poolSize connections; rueidis finds cluster mode by itself.
func newLimiter(client, addr string, cluster bool, poolSize int) (*ratelimit.Limiter, func(), error) {
	if client == "rueidis" {
		rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, DisableRetry: true})
		if err != nil {
			return nil, nil, err
		}
		b, err := rueidisbackend.New(rc)
		if err != nil {
			rc.Close()
			return nil, nil, err
		}
		return ratelimit.New(b), rc.Close, nil
	}
	var c redis.UniversalClient
	if cluster {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, MaxRetries: -1, MaxRedirects: -1,
			ContextTimeoutEnabled: true, PoolSize: poolSize})
	} else {
		c = redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, PoolSize: poolSize})
	}
	b, err := redisbackend.New(c)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return ratelimit.New(b), func() { c.Close() }, nil
}
