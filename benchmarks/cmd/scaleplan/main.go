// Command scaleplan measures the figures of docs/scale.md, the capacity plan
// for a million decisions a second over 100 million keys, that the other
// benchmarks of this module do not give: Redis memory per key at a million
// keys, what a full Redis does to a decision, the bytes, server CPU and
// client CPU of one decision, and the memory backend at ten million keys.
// benchmarks/results/2026-12-07-scaleplan holds the outputs the page cites
// and the commands that made them.
//
// Usage:
//
//	go run ./cmd/scaleplan -mode redis-memory|oom|net|memory-backend [flags]
//
// # Modes
//
//   - redis-memory: one decision on each of -n new keys (1,000,000 by
//     default) from -goroutines goroutines through sluice's go-redis
//     backend, then -settle of rest. It prints the bucket's value length
//     (STRLEN) and MEMORY USAGE (SAMPLES 0, the mean over 1,000 of the
//     keys), and INFO memory's used_memory and used_memory_rss after less
//     before, divided by DBSIZE: what a key costs the server, its share of
//     the keyspace's hash tables included. cmd/redismemory gives MEMORY
//     USAGE alone, of one key, for sluice and its peers, on any server;
//     this mode needs a server with no other keys.
//   - oom: sets maxmemory 1 MiB above used_memory, decides on new keys until
//     a decision fails, then decides once on the first key, which exists,
//     and prints both errors and whether they wrap
//     ratelimit.ErrBackendUnavailable or ratelimit.ErrKeyRejected. It
//     restores maxmemory at the end.
//   - net: one decision on each of -keys keys (storing them and warming
//     every connection), then -n decisions (200,000 by default) over the
//     same keys in turn, from -goroutines goroutines, through -client, with
//     -op. It prints, per call of sluice's Redis Function, the bytes the
//     server received and sent and appended to its replication stream (INFO
//     stats total_net_input_bytes and total_net_output_bytes, INFO
//     replication master_repl_offset; 0 without a replica), the server's
//     CPU time (INFO cpu used_cpu_user + used_cpu_sys), the time inside the
//     function (INFO commandstats cmdstat_fcall usec) and this process's
//     CPU time (getrusage), and the decisions a second. An INFO round alone
//     sends and receives the same bytes each time, so the bytes of one,
//     measured just before the run, are taken off the run's; its CPU time
//     is too small to matter.
//   - memory-backend: no Redis. One decision on each of -n new keys
//     (10,000,000 by default) of a memory backend made with
//     memory.New(memory.WithMaxKeys(n+1)); it prints the live heap per key,
//     read as BenchmarkKeyMemory reads it, beyond the key strings, which it
//     holds in a slice and prints apart. Then -duration of decisions on keys
//     drawn at random, from one goroutine and from GOMAXPROCS, and the
//     decisions a second of each. The backend keeps its sweep, once a
//     minute, which drops every bucket that has refilled (the hot config's
//     do a microsecond after their decision): it fails if a sweep came
//     before the heap was read, and a sweep during the timed runs makes
//     their next decisions create the buckets again.
//
// A denied decision is an error, but in oom and with -op any, which counts
// denials.
//
// # Servers
//
// Without -addr it starts the redis-servers of -topology (from $PATH, or
// -redis-server) on free ports of 127.0.0.1, with --save "" --appendonly
// no, and stops them at the end:
//
//   - standalone: one server.
//   - cluster: one server with --cluster-enabled yes that holds every slot
//     (CLUSTER ADDSLOTSRANGE 0 16383). The go-redis client is then a
//     ClusterClient; rueidis finds cluster mode by itself.
//   - replica: a standalone server and a replica of it (--replicaof); the
//     first is measured.
//
// With -addr it measures that server instead, which must be one node (a
// standalone server, or a cluster node holding every slot), as the INFO
// counters read are one server's. It never flushes a server: redis-memory
// and oom refuse one that holds any key, and delete the keys they wrote at
// the end. net leaves its keys, which expire once their buckets have
// refilled. redis-server 7.0 or later is needed (Redis Functions,
// --cluster-port).
//
// The user keys are -prefix followed by 10000000, 10000001, ..., which
// sluice's Redis backends store as {user:10000000}, ...
//
// # Flags
//
//	-mode         redis-memory, oom, net or memory-backend (required)
//	-addr         a redis-server to measure instead of starting one
//	-topology     the servers to start without -addr: standalone, cluster or replica (standalone)
//	-redis-server the redis-server binary to start (redis-server, from $PATH)
//	-config       the limit, one of day1000, day500, burst+day, burst+day500, hot (day1000; configs.go says what each is)
//	-n            keys (redis-memory, memory-backend) or timed decisions (net); 0 for the mode's default
//	-keys         keys the decisions of net go round (10,000)
//	-goroutines   goroutines deciding in redis-memory and net (64)
//	-client       net's client: goredis or rueidis (goredis)
//	-op           net's decision: consume (Consume of 1 token), any (the same, denials allowed)
//	              or upto:K (ConsumeUpTo of K tokens, every one granted) (consume)
//	-prefix       the user keys' prefix (user:)
//	-settle       rest before redis-memory reads INFO memory (10s)
//	-duration     each timed run of memory-backend (5s)
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ratelimit"
)

// firstKey is the number of the first user key: every key has eight digits,
// as the plan's user:12345678 does.
const firstKey = 10_000_000

// The modes' defaults for -n.
const (
	defaultRedisMemoryKeys   = 1_000_000
	defaultNetDecisions      = 200_000
	defaultMemoryBackendKeys = 10_000_000
)

// flags are the command line.
type flags struct {
	mode, addr, topology, redisServer string
	config                            string
	n, keys, goroutines               int
	client, op, prefix                string
	settle, duration                  time.Duration
}

func main() {
	var f flags
	flag.StringVar(&f.mode, "mode", "", "the measurement: redis-memory, oom, net or memory-backend")
	flag.StringVar(&f.addr, "addr", "", "address of a redis-server to measure instead of starting one: standalone, or a cluster node holding every slot")
	flag.StringVar(&f.topology, "topology", "standalone", "the redis-servers to start without -addr: standalone, cluster (one node, every slot) or replica (a server and its replica)")
	flag.StringVar(&f.redisServer, "redis-server", "redis-server", "the redis-server binary to start")
	flag.StringVar(&f.config, "config", "day1000", "the limit: "+strings.Join(configNames(), ", "))
	flag.IntVar(&f.n, "n", 0, fmt.Sprintf("keys (redis-memory, memory-backend) or timed decisions (net); 0 for %d, %d and %d",
		defaultRedisMemoryKeys, defaultMemoryBackendKeys, defaultNetDecisions))
	flag.IntVar(&f.keys, "keys", 10_000, "the keys net's decisions go round")
	flag.IntVar(&f.goroutines, "goroutines", 64, "goroutines deciding in redis-memory and net")
	flag.StringVar(&f.client, "client", "goredis", "net's client: goredis or rueidis")
	flag.StringVar(&f.op, "op", "consume", "net's decision: consume, any (consume, denials allowed) or upto:K (ConsumeUpTo of K tokens)")
	flag.StringVar(&f.prefix, "prefix", "user:", "the user keys' prefix, before their eight digits")
	flag.DurationVar(&f.settle, "settle", 10*time.Second, "rest before redis-memory reads INFO memory, for the server to finish rehashing")
	flag.DurationVar(&f.duration, "duration", 5*time.Second, "each timed run of memory-backend")
	flag.Parse()
	op, opErr := parseOp(f.op)
	if _, ok := configs[f.config]; !ok || opErr != nil || flag.NArg() > 0 ||
		!slices.Contains([]string{"redis-memory", "oom", "net", "memory-backend"}, f.mode) ||
		!slices.Contains([]string{"standalone", "cluster", "replica"}, f.topology) ||
		!slices.Contains([]string{"goredis", "rueidis"}, f.client) ||
		f.n < 0 || f.keys < 1 || f.goroutines < 1 || f.settle < 0 || f.duration <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	f.n = cmp.Or(f.n, defaultN(f.mode))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, f, op)
	stop()
	if err != nil {
		log.Fatalf("scaleplan: %v", err)
	}
}

// defaultN is the -n of mode when the flag is 0.
func defaultN(mode string) int {
	switch mode {
	case "net":
		return defaultNetDecisions
	case "memory-backend":
		return defaultMemoryBackendKeys
	}
	return defaultRedisMemoryKeys
}

// run makes the measurement of f.mode, on servers of its own unless f.addr
// names one.
func run(ctx context.Context, f flags, op op) error {
	cfg := configs[f.config]
	if f.mode == "memory-backend" {
		return measureMemoryBackend(ctx, f, cfg)
	}
	addr := f.addr
	if addr == "" {
		d, err := startDeployment(ctx, f.redisServer, f.topology)
		if err != nil {
			return err
		}
		defer d.stop()
		addr = d.addr
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, PoolSize: f.goroutines + 4})
	defer rdb.Close()
	cluster, err := clusterMode(ctx, rdb)
	if err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	switch f.mode {
	case "redis-memory":
		return measureRedisMemory(ctx, f, rdb, cluster, cfg)
	case "oom":
		return measureOOM(ctx, f, rdb, cfg)
	default:
		return measureNet(ctx, f, op, rdb, addr, cluster, cfg)
	}
}

// userKey is the i-th user key.
func (f flags) userKey(i int) string { return f.prefix + strconv.Itoa(firstKey+i) }

// allowed fails a decision that is not allowed.
func allowed(d ratelimit.Decision, err error, key string) error {
	if err == nil && !d.Allowed {
		err = fmt.Errorf("a decision on %s was denied", key)
	}
	return err
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
