// Command redisceiling measures the server's own ceiling for a limiter's
// script: the decisions per second one redis-server makes when clients
// cost next to nothing and deep pipelining hides the round trips, as
// redis-benchmark -P 64 measures it for a command.
//
// redis-benchmark itself cannot send sluice's script call: the request is
// packed into one binary argument with NUL bytes, and redis-benchmark
// formats its arguments, -x's too, as C strings, so the server gets the
// argument cut at its first NUL. This command does what redis-benchmark
// does, binary-safe: -c connections, each writing -P calls, then reading
// their -P replies, again and again for -duration.
//
// The calls are the ones the limiter sends. A go-redis hook records the
// call of one untimed decision on each key (sluice over go-redis: an FCALL
// of its library's function, or an EVALSHA on a server without Redis
// Functions; github.com/go-redis/redis_rate/v10: an EVALSHA), and those
// bytes are replayed; both read the server's clock, so a replayed call is a
// fresh decision.
// The untimed decisions also store every key, as in BenchmarkRedis, and
// every reply is checked to be an allowed decision.
//
// Usage:
//
//	go run ./cmd/redisceiling -impl sluice|redis_rate [-keys 10000] [-c 4] [-P 64] [-duration 5s] [-addr ADDR]
//
// It prints one line in the Go benchmark format, for benchstat:
// requests/s, and per call the server's CPU time (server-µs/op, from INFO
// cpu) and the time inside the script or function (script-µs/op, from
// INFO commandstats, EVALSHA's and FCALL's; it leaves out reading, parsing
// and replying). With
// -print-command it prints instead the command of one decision on the user
// key ceiling:__rand_int__, for redis-benchmark -r (redis_rate only: its
// arguments are text).
//
// The address defaults to $SLUICE_REDIS_ADDR. The keys are
// ceiling:0 ... ceiling:N-1 (with the limiter's prefix), deleted at the end.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/benchmarks"
	"github.com/sluicehq/sluice/ratelimit"
)

// flags are the command line.
type flags struct {
	addr, impl   string
	keys         int
	conns, depth int
	duration     time.Duration
	printCommand bool
}

func main() {
	var f flags
	flag.StringVar(&f.addr, "addr", os.Getenv("SLUICE_REDIS_ADDR"), "address of the redis-server")
	flag.StringVar(&f.impl, "impl", "", "whose script: sluice or redis_rate")
	flag.IntVar(&f.keys, "keys", 10_000, "distinct keys, called round robin; 1 is one hot key")
	flag.IntVar(&f.conns, "c", 4, "connections")
	flag.IntVar(&f.depth, "P", 64, "calls in flight on each connection")
	flag.DurationVar(&f.duration, "duration", 5*time.Second, "how long to send calls")
	flag.BoolVar(&f.printCommand, "print-command", false, "print one decision's command for redis-benchmark and exit")
	flag.Parse()
	if f.addr == "" || f.keys < 1 || f.conns < 1 || f.depth < 1 || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(context.Background(), f); err != nil {
		log.Fatalf("redisceiling: %v", err)
	}
}

func run(ctx context.Context, f flags) error {
	rec := &recorder{}
	rdb := redis.NewClient(&redis.Options{Addr: f.addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer rdb.Close()
	rdb.AddHook(rec)
	allow, err := limiter(f.impl, rdb)
	if err != nil {
		return err
	}
	if f.printCommand {
		return printCommand(ctx, rdb, allow, rec)
	}

	calls, redisKeys, err := record(ctx, allow, rec, f.keys)
	defer func() {
		if err := deleteKeys(ctx, rdb, redisKeys); err != nil {
			log.Printf("redisceiling: delete the keys: %v", err)
		}
	}()
	if err != nil {
		return err
	}
	before, err := readStats(ctx, rdb)
	if err != nil {
		return err
	}
	n, elapsed, err := pipeline(f, calls)
	if err != nil {
		return err
	}
	after, err := readStats(ctx, rdb)
	if err != nil {
		return err
	}
	fmt.Printf("BenchmarkRedisCeiling/keys=%s/impl=%s\t%d\t%.0f ns/op\t%.0f requests/s\t%.2f server-µs/op\t%.2f script-µs/op\n",
		keysLabel(f.keys), f.impl, n,
		float64(elapsed.Nanoseconds())/float64(n), float64(n)/elapsed.Seconds(),
		micros(after.cpu-before.cpu)/float64(n),
		float64(after.scriptUsec-before.scriptUsec)/float64(after.scriptCalls-before.scriptCalls))
	return nil
}

// limiter returns one decision of impl on the limit of the Redis
// benchmarks, through rdb.
func limiter(impl string, rdb *redis.Client) (func(ctx context.Context, key string) error, error) {
	switch impl {
	case "sluice":
		backend, err := redisbackend.New(rdb)
		if err != nil {
			return nil, err
		}
		lim, cfg := ratelimit.New(backend), benchmarks.RedisConfig()
		return func(ctx context.Context, key string) error {
			d, err := lim.Allow(ctx, key, cfg)
			return allowed(key, d.Allowed, err)
		}, nil
	case "redis_rate":
		lim, limit := redis_rate.NewLimiter(rdb), benchmarks.RedisRateLimit()
		return func(ctx context.Context, key string) error {
			res, err := lim.Allow(ctx, key, limit)
			if err != nil {
				return err
			}
			return allowed(key, res.Allowed == 1, nil)
		}, nil
	}
	return nil, fmt.Errorf("-impl %q: want sluice or redis_rate", impl)
}

func allowed(key string, ok bool, err error) error {
	if err == nil && !ok {
		err = fmt.Errorf("decision on %q denied: the limit must admit every call", key)
	}
	return err
}

// recorder is a go-redis hook that keeps the arguments of the last EVALSHA
// or FCALL the client sent. The limiters send EVAL with the script's
// source only after an EVALSHA failed with NOSCRIPT, and FUNCTION LOAD
// only after an FCALL failed for want of the function, and then the same
// call again.
type recorder struct {
	mu   sync.Mutex
	last []any
}

func (r *recorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "fcall" {
			r.mu.Lock()
			r.last = append([]any(nil), cmd.Args()...)
			r.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (r *recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// decide makes one decision on key and returns the call it sent:
// "evalsha" and the SHA, or "fcall" and the function, then the key count
// (1), the Redis key, the arguments.
func (r *recorder) decide(ctx context.Context, allow func(context.Context, string) error, key string) ([]any, error) {
	r.mu.Lock()
	r.last = nil
	r.mu.Unlock()
	if err := allow(ctx, key); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.last) < 4 {
		return nil, fmt.Errorf("decision on %q sent no EVALSHA or FCALL with a key", key)
	}
	return r.last, nil
}

// record makes one decision on each of n keys and returns each one's
// call encoded in RESP, and the Redis keys.
func record(ctx context.Context, allow func(context.Context, string) error, rec *recorder, n int) (calls [][]byte, redisKeys []string, err error) {
	for i := range n {
		args, err := rec.decide(ctx, allow, "ceiling:"+strconv.Itoa(i))
		if err != nil {
			return calls, redisKeys, err
		}
		call, err := appendCommand(nil, args)
		if err != nil {
			return calls, redisKeys, err
		}
		calls = append(calls, call)
		redisKeys = append(redisKeys, fmt.Sprint(args[3]))
	}
	return calls, redisKeys, nil
}

// appendCommand appends args to b as a RESP array of bulk strings,
// formatting each argument as go-redis does.
func appendCommand(b []byte, args []any) ([]byte, error) {
	b = fmt.Appendf(b, "*%d\r\n", len(args))
	for _, arg := range args {
		var s string
		switch v := arg.(type) {
		case string:
			s = v
		case int:
			s = strconv.Itoa(v)
		case int64:
			s = strconv.FormatInt(v, 10)
		case float64:
			s = strconv.FormatFloat(v, 'f', -1, 64)
		default:
			return nil, fmt.Errorf("argument %v of type %T: not encoded", arg, arg)
		}
		b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(s), s)
	}
	return b, nil
}

// printCommand prints the call of one decision on the user key
// ceiling:__rand_int__ as words for redis-benchmark's command line.
func printCommand(ctx context.Context, rdb *redis.Client, allow func(context.Context, string) error, rec *recorder) error {
	args, err := rec.decide(ctx, allow, "ceiling:__rand_int__")
	if err != nil {
		return err
	}
	if err := rdb.Del(ctx, fmt.Sprint(args[3])).Err(); err != nil {
		return err
	}
	words := make([]string, len(args))
	for i, arg := range args {
		words[i] = fmt.Sprint(arg)
		if strings.IndexFunc(words[i], func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
			return fmt.Errorf("argument %d is binary: redis-benchmark would send it cut at its first NUL", i)
		}
	}
	fmt.Println(strings.Join(words, " "))
	return nil
}

// pipeline sends calls round robin on f.conns connections, f.depth at a
// time on each, until f.duration has passed, and returns how many replies
// came back and in how long. Every reply must be an allowed decision.
func pipeline(f flags, calls [][]byte) (int64, time.Duration, error) {
	conns := make([]net.Conn, f.conns)
	for i := range conns {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			return 0, 0, err
		}
		defer c.Close()
		conns[i] = c
	}
	var (
		total atomic.Int64
		wg    sync.WaitGroup
		errs  = make([]error, len(conns))
	)
	start := time.Now()
	deadline := start.Add(f.duration)
	for i, c := range conns {
		// Spread the connections' starting points over the keys.
		first := i * len(calls) / len(conns)
		wg.Go(func() {
			n, err := drive(c, calls, first, f.depth, deadline)
			total.Add(n)
			errs[i] = err
		})
	}
	wg.Wait()
	return total.Load(), time.Since(start), errors.Join(errs...)
}

// drive is one connection's loop: write depth calls in one write, read
// their replies, until deadline.
func drive(c net.Conn, calls [][]byte, next, depth int, deadline time.Time) (int64, error) {
	r := bufio.NewReaderSize(c, 64<<10)
	var batch []byte
	var n int64
	for time.Now().Before(deadline) {
		batch = batch[:0]
		for range depth {
			batch = append(batch, calls[next]...)
			if next++; next == len(calls) {
				next = 0
			}
		}
		if _, err := c.Write(batch); err != nil {
			return n, err
		}
		for range depth {
			if err := readAllowed(r); err != nil {
				return n, err
			}
		}
		n += int64(depth)
	}
	return n, nil
}

// readAllowed reads one reply of either limiter and checks that it is an
// allowed decision: sluice's, a bulk string whose first byte is 1 (see
// internal/redisscript's Call.Decision); redis_rate's, an array whose first
// element is the integer 1.
func readAllowed(r *bufio.Reader) error {
	line, err := readLine(r)
	if err != nil {
		return err
	}
	if line[0] == '$' {
		size, err := strconv.Atoi(line[1:])
		if err != nil || size < 1 {
			return fmt.Errorf("reply %q: want a decision", line)
		}
		b, err := r.Peek(size + 2)
		if err != nil {
			return err
		}
		if b[0] != 1 || string(b[size:]) != "\r\n" {
			return fmt.Errorf("reply %q: want an allowed decision", b)
		}
		_, err = r.Discard(size + 2)
		return err
	}
	if line[0] != '*' {
		return fmt.Errorf("reply %q: want an array", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 1 {
		return fmt.Errorf("reply %q: want an array", line)
	}
	for i := range n {
		elem, err := readLine(r)
		if err != nil {
			return err
		}
		switch {
		case i == 0 && elem != ":1":
			return fmt.Errorf("reply's first element %q: want :1, an allowed decision", elem)
		case elem[0] == ':':
		case elem[0] == '$':
			size, err := strconv.Atoi(elem[1:])
			if err != nil {
				return fmt.Errorf("reply element %q: %v", elem, err)
			}
			if _, err := r.Discard(size + 2); err != nil {
				return err
			}
		default:
			return fmt.Errorf("reply element %q: want an integer or a bulk string", elem)
		}
	}
	return nil
}

// readLine reads one line of a reply without its CRLF; a server error is
// returned as an error.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return "", err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return "", fmt.Errorf("malformed reply line %q", line)
	}
	s := string(line[:len(line)-2])
	if s[0] == '-' {
		return "", errors.New("server: " + s[1:])
	}
	return s, nil
}

// stats are the server's counters a run is measured by.
type stats struct {
	cpu                     time.Duration
	scriptCalls, scriptUsec int64
}

// readStats reads the server's CPU time (INFO cpu: user and system, all its
// threads) and the counters of EVALSHA and FCALL (INFO commandstats).
func readStats(ctx context.Context, rdb *redis.Client) (stats, error) {
	info, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return stats{}, err
	}
	var s stats
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_user", "used_cpu_sys":
			secs, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return stats{}, fmt.Errorf("INFO cpu %s: %v", line, err)
			}
			s.cpu += time.Duration(secs * float64(time.Second))
		case "cmdstat_evalsha", "cmdstat_fcall":
			for field := range strings.SplitSeq(value, ",") {
				k, v, _ := strings.Cut(field, "=")
				if k != "calls" && k != "usec" {
					continue
				}
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return stats{}, fmt.Errorf("INFO commandstats %s: %v", line, err)
				}
				if k == "calls" {
					s.scriptCalls += n
				} else {
					s.scriptUsec += n
				}
			}
		}
	}
	return s, nil
}

func deleteKeys(ctx context.Context, rdb *redis.Client, keys []string) error {
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), 1000)]
		keys = keys[len(chunk):]
		if err := rdb.Del(ctx, chunk...).Err(); err != nil {
			return err
		}
	}
	return nil
}

// keysLabel names a key count as BenchmarkRedis does: 10k, 1.
func keysLabel(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
