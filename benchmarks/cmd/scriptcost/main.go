// Command scriptcost counts the instructions redis-server executes for one
// decision of each limiter, with callgrind: sluice's token bucket and GCRA
// on one and on two greedy bandwidths, its fixed window, sliding window
// counter and sliding window log on one, and
// github.com/go-redis/redis_rate/v10, against a PING on the same
// connection. benchmarks/scriptcost.sh starts the server under callgrind
// and runs it.
//
// For each case it makes one untimed decision on each of -keys keys (which
// loads the script or function and stores every key, as BenchmarkRedis
// does), zeroes callgrind's counters (callgrind_control -z), makes -n
// decisions round robin over the keys on one connection, one at a time,
// and dumps the counters (callgrind_control -d). Every decision must be
// allowed. It prints one line per case in the Go benchmark format, for
// benchstat: Ir/op, the instructions per call, and over-ping-Ir/op, the
// same less a PING's, which is the cost of reading, dispatching and
// answering a command: what is left is the script's (or function's) call.
//
// Usage:
//
//	go run ./cmd/scriptcost -addr ADDR -pid PID -out FILE [-n 2000] [-keys 100]
//
// PID is the callgrind process's and FILE its --callgrind-out-file; the
// dumps are FILE.1, FILE.2, ... The keys are cost:<case>:0 ... (with the
// limiter's prefix), deleted at the end.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/benchmarks"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// flags are the command line.
type flags struct {
	addr, out string
	pid, n    int
	keys      int
	cases     *regexp.Regexp
}

// decide is one decision on key; it fails if the decision is not allowed.
type decide func(ctx context.Context, key string) error

// costCase is one line of the output.
type costCase struct {
	name   string
	decide decide
	// reset deletes what the limiter keeps for key.
	reset func(ctx context.Context, key string) error
}

func main() {
	var f flags
	flag.StringVar(&f.addr, "addr", os.Getenv("SLUICE_REDIS_ADDR"), "address of the redis-server under callgrind")
	flag.IntVar(&f.pid, "pid", 0, "pid of the callgrind process running redis-server")
	flag.StringVar(&f.out, "out", "", "callgrind's --callgrind-out-file")
	flag.IntVar(&f.n, "n", 2000, "decisions per case")
	flag.IntVar(&f.keys, "keys", 100, "distinct keys per case, called round robin")
	cases := flag.String("cases", "", "a regular expression: measure only the cases it matches (and ping)")
	flag.Parse()
	var err error
	if f.cases, err = regexp.Compile(*cases); err != nil {
		log.Fatalf("scriptcost: -cases: %v", err)
	}
	if f.addr == "" || f.pid < 1 || f.out == "" || f.n < 1 || f.keys < 1 || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(context.Background(), f); err != nil {
		log.Fatalf("scriptcost: %v", err)
	}
}

func run(ctx context.Context, f flags) error {
	// Under callgrind the server runs some fifty times slower.
	rdb := redis.NewClient(&redis.Options{
		Addr: f.addr, MaxRetries: -1, PoolSize: 1, ReadTimeout: time.Minute, WriteTimeout: time.Minute,
	})
	defer rdb.Close()
	cases, err := costCases(rdb)
	if err != nil {
		return err
	}
	var ping float64
	for _, c := range cases {
		if c.name != "ping" && !f.cases.MatchString(c.name) {
			continue
		}
		ir, err := measure(ctx, f, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		if c.name == "ping" {
			ping = ir
		}
		fmt.Printf("BenchmarkScriptCost/case=%s\t%d\t%.0f Ir/op\t%.0f over-ping-Ir/op\n", c.name, f.n, ir, ir-ping)
	}
	return nil
}

// costCases are PING first, then the limiters.
func costCases(rdb *redis.Client) ([]costCase, error) {
	backend, err := redisbackend.New(rdb)
	if err != nil {
		return nil, err
	}
	lim := ratelimit.New(backend)
	sluice := func(name string, alg ratelimit.Algorithm, bws ...ratelimit.Bandwidth) costCase {
		cfg := ratelimit.Config{Algorithm: alg, Bandwidths: bws}
		return costCase{
			name: name,
			decide: func(ctx context.Context, key string) error {
				d, err := lim.Allow(ctx, key, cfg)
				return allowed(key, d.Allowed, err)
			},
			reset: func(ctx context.Context, key string) error {
				return rdb.Del(ctx, redisscript.Key(redisbackend.DefaultPrefix, key)).Err()
			},
		}
	}
	// Two greedy bandwidths that admit every call, as RedisConfig's one does.
	one := benchmarks.RedisConfig().Bandwidths[0]
	burst, hourly := one, ratelimit.Every(time.Hour, 1000).WithBurst(benchmarks.RedisBurst)
	burst.ID, hourly.ID = "burst", "hourly"
	// The windows count RedisBurst requests a period, which no run reaches.
	window := ratelimit.Every(benchmarks.RedisRefillPeriod, benchmarks.RedisBurst)

	rr, limit := redis_rate.NewLimiter(rdb), benchmarks.RedisRateLimit()
	return []costCase{
		{
			name:   "ping",
			decide: func(ctx context.Context, _ string) error { return rdb.Ping(ctx).Err() },
			reset:  func(context.Context, string) error { return nil },
		},
		{
			name: "redis_rate",
			decide: func(ctx context.Context, key string) error {
				res, err := rr.Allow(ctx, key, limit)
				if err != nil {
					return err
				}
				return allowed(key, res.Allowed == 1, nil)
			},
			reset: rr.Reset,
		},
		sluice("sluice-tokenbucket-1", ratelimit.TokenBucket, one),
		sluice("sluice-tokenbucket-2", ratelimit.TokenBucket, burst, hourly),
		sluice("sluice-gcra-1", ratelimit.GCRA, one),
		sluice("sluice-gcra-2", ratelimit.GCRA, burst, hourly),
		sluice("sluice-fixedwindow-1", ratelimit.FixedWindow, window),
		sluice("sluice-slidingcounter-1", ratelimit.SlidingWindowCounter, window),
		// The log keeps a member a request, so it gets the most a log may
		// hold, in a window no run ends: each key's log grows by n/keys.
		sluice("sluice-slidinglog-1", ratelimit.SlidingWindowLog, ratelimit.Every(time.Hour, ratelimit.MaxLogCapacity)),
	}, nil
}

func allowed(key string, ok bool, err error) error {
	if err == nil && !ok {
		err = fmt.Errorf("decision on %q denied: the limit must admit every call", key)
	}
	return err
}

// measure returns the instructions per decision of c: the counters from
// just before the first timed decision to just after the last.
func measure(ctx context.Context, f flags, c costCase) (float64, error) {
	keys := make([]string, f.keys)
	for i := range keys {
		keys[i] = "cost:" + c.name + ":" + strconv.Itoa(i)
		if err := c.decide(ctx, keys[i]); err != nil {
			return 0, err
		}
	}
	defer reset(ctx, c, keys)
	if err := callgrindControl(f.pid, "-z"); err != nil {
		return 0, err
	}
	for i := range f.n {
		if err := c.decide(ctx, keys[i%len(keys)]); err != nil {
			return 0, err
		}
	}
	if err := callgrindControl(f.pid, "-d"); err != nil {
		return 0, err
	}
	total, err := lastTotal(f.out)
	if err != nil {
		return 0, err
	}
	return float64(total) / float64(f.n), nil
}

func reset(ctx context.Context, c costCase, keys []string) {
	for _, k := range keys {
		if err := c.reset(ctx, k); err != nil {
			log.Printf("scriptcost: %s: delete the state of %q: %v", c.name, k, err)
		}
	}
}

func callgrindControl(pid int, arg string) error {
	out, err := exec.Command("callgrind_control", arg, strconv.Itoa(pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("callgrind_control %s %d: %v: %s", arg, pid, err, out)
	}
	return nil
}

// lastTotal reads the totals line of the latest dump, base.N for the
// highest N.
func lastTotal(base string) (int64, error) {
	files, err := filepath.Glob(base + ".*")
	if err != nil {
		return 0, err
	}
	latest, latestN := "", 0
	for _, file := range files {
		if n, err := strconv.Atoi(strings.TrimPrefix(file, base+".")); err == nil && n > latestN {
			latest, latestN = file, n
		}
	}
	if latest == "" {
		return 0, fmt.Errorf("no callgrind dump %s.N", base)
	}
	fh, err := os.Open(latest)
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	s := bufio.NewScanner(fh)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "totals: "); ok {
			return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no totals line", latest)
}
