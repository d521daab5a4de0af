// Command burstlatency measures how long healthy Redis decisions take when
// a burst of requests arrives at once, to size failpolicy's per-decision
// deadline (failpolicy.DefaultTimeout) above what a healthy store needs.
//
// The scenario: two replicas of a service, each a separate OS process with
// a client of its own, get a burst of 100 simultaneous requests each, all
// on the same user key. Each request is one decision of the bare sluice
// backend (no failpolicy) on the limit "20 a second + 1000 an hour":
//
//	ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
//		ratelimit.PerSecond(20), ratelimit.PerHour(1000)}}
//
// In each replica the burst's goroutines are started first and parked on
// a barrier; the parent process tells both replicas a wall-clock time to
// open it, and each sleeps to a millisecond before it and spins the rest,
// so on an idle machine the two bursts mostly start within a microsecond
// of each other (the output reports the skew: a replica the scheduler
// wakes late starts late). Every burst is on a fresh key, so
// each one admits 20 of its 200 calls; the output reports the least and
// most admitted per burst as a check that the limit held. Bursts are
// paused -pause apart, and the clients take turns, burst by burst, so that
// whatever else the machine does falls on every client alike.
//
// Each call gets two latencies, both to the call's return:
//
//   - from-release: from the barrier's opening. This is what a request
//     caught in the burst waits: the time its goroutine waits to be
//     scheduled is part of it.
//   - own: from the goroutine's own start of the call, the time that a
//     deadline set at the start of the decision (as failpolicy sets it)
//     is measured against.
//
// The clients, each with the backend's low-latency helper:
//
//   - goredis-pool-default: go-redis v9, redisbackend.LowLatency, the
//     default PoolSize (10 × GOMAXPROCS).
//   - goredis-pool100: the same with PoolSize 100, a connection for each
//     goroutine.
//   - rueidis: rueidis with rueidisbackend.LowLatency and otherwise its
//     defaults (automatic pipelining on shared connections).
//
// Every call has a context deadline of -deadline (1s by default: as
// failpolicy does, a deadline is set, but one long enough not to cut the
// distribution; LowLatency's 50ms socket and pool timeouts still apply to
// go-redis). Calls that fail are counted by kind, and left out of the
// rows of the calls that succeeded.
//
// Usage:
//
//	go run ./cmd/burstlatency [-redis ADDR] [-bursts 300] [-burn 0] [flags]
//
// Without -redis it starts a redis-server of its own (from $PATH, or
// -redis-server) on a free port of 127.0.0.1 with --save "" --appendonly
// no, and stops it at the end. With -burn N it also runs a CPU burner, a
// separate process spinning on N threads, for the whole measurement: -burn
// 2 loads both cores of a 2-CPU machine. The replicas and the burner are
// this program re-executed with -role; they exit when the parent's pipe to
// them closes. benchmarks/burst.sh runs it idle and loaded and keeps the
// outputs.
//
// The output is text: a header with the settings and the CPU time the
// machine, this run's processes and all others spent during the measured
// bursts (to tell a run disturbed by other work), then a table with one
// line per client and latency, in milliseconds, with samples, errors, p50,
// p90, p99, p99.9 and max. The rows from-release and own are the calls
// that succeeded; when some failed, from-release+failed and own+failed
// are every call, a failed one at the time it failed; burst-slowest has
// one sample per burst, its slowest call from release. Calls within a
// burst wait on each other, so the slowest few hundred samples come from
// a few bursts: with 300 bursts of 200 calls, p99.9 is decided by the
// worst burst or two. Then, per client: the share of calls slower than
// some deadlines (failed calls counted as slower), the errors by kind with
// an example, the admitted calls per burst (a burst longer than 50ms may
// admit a token more per 50ms, and a failed call may have taken a token
// without its caller knowing), and how closely the replicas' releases met.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// limit is the config of every burst: a burst of 20 a second, and 1000 an
// hour.
var limit = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
	ratelimit.PerSecond(20),
	ratelimit.PerHour(1000),
}}

// admitPerBurst is what a burst on a fresh key should admit: the capacity
// of limit's tightest bandwidth (a refill of one token every 50ms could add
// one to a burst that lasts longer).
const admitPerBurst = 20

// clientNames are the clients measured, in the order they take turns.
var clientNames = []string{"goredis-pool-default", "goredis-pool100", "rueidis"}

// flags are the command line.
type flags struct {
	role        string
	redisAddr   string
	redisServer string
	clients     string
	bursts      int
	warmup      int
	replicas    int
	goroutines  int
	pause       time.Duration
	lead        time.Duration
	deadline    time.Duration
	burn        int
}

func main() {
	var f flags
	flag.StringVar(&f.role, "role", "parent", "parent, or (run by the parent) replica or burn")
	flag.StringVar(&f.redisAddr, "redis", "", "address of a redis-server to use instead of starting one")
	flag.StringVar(&f.redisServer, "redis-server", "redis-server", "the redis-server binary to start")
	flag.StringVar(&f.clients, "clients", strings.Join(clientNames, ","), "clients to measure, comma-separated")
	flag.IntVar(&f.bursts, "bursts", 300, "measured bursts per client")
	flag.IntVar(&f.warmup, "warmup", 5, "bursts per client before measuring, not counted")
	flag.IntVar(&f.replicas, "replicas", 2, "replica processes")
	flag.IntVar(&f.goroutines, "goroutines", 100, "concurrent calls per replica per burst")
	flag.DurationVar(&f.pause, "pause", 50*time.Millisecond, "pause after each burst")
	flag.DurationVar(&f.lead, "lead", 20*time.Millisecond, "how far ahead the parent schedules a burst's start")
	flag.DurationVar(&f.deadline, "deadline", time.Second, "context deadline of each call; 0 for none")
	flag.IntVar(&f.burn, "burn", 0, "threads of a CPU burner process running during the measurement; 0 for none")
	flag.Parse()
	if flag.NArg() > 0 || f.bursts < 1 || f.warmup < 0 || f.replicas < 1 || f.goroutines < 1 ||
		f.pause < 0 || f.lead <= 0 || f.deadline < 0 || f.burn < 0 {
		flag.Usage()
		os.Exit(2)
	}
	var err error
	switch f.role {
	case "parent":
		err = runParent(f)
	case "replica":
		err = runReplica(f)
	case "burn":
		err = runBurner(f.burn)
	default:
		err = fmt.Errorf("-role %q: want parent, replica or burn", f.role)
	}
	if err != nil {
		log.Fatalf("burstlatency %s: %v", f.role, err)
	}
}

// The messages between the parent and a replica are JSON lines: the parent
// writes commands on the replica's stdin, the replica answers each on its
// stdout.

// command is one message to a replica: a burst, or Quit.
type command struct {
	Quit   bool   `json:"quit,omitempty"`
	Client string `json:"client,omitempty"`
	Key    string `json:"key,omitempty"`
	// At is the wall-clock time to release the burst, in Unix nanoseconds.
	At int64 `json:"at,omitempty"`
}

// burstResult is a replica's answer to a burst: per call, in the order of
// its goroutines, the two latencies in nanoseconds, and its error kind
// ("" for none).
type burstResult struct {
	Admitted    int               `json:"admitted"`
	Released    int64             `json:"released"` // Unix ns
	Late        int64             `json:"late"`     // ns after At
	FromRelease []int64           `json:"from_release"`
	Own         []int64           `json:"own"`
	Errs        []string          `json:"errs"`
	Examples    map[string]string `json:"examples,omitempty"`
	Error       string            `json:"error,omitempty"`
}

// ready is a replica's first line: the clients it set up.
type ready struct {
	Clients map[string]string `json:"clients"` // name: its settings
	Error   string            `json:"error,omitempty"`
}

// --- replica ---

// client is one measured client in a replica.
type client struct {
	desc  string
	lim   *ratelimit.Limiter
	close func()
}

func newClient(ctx context.Context, name, addr string) (*client, error) {
	switch name {
	case "goredis-pool-default", "goredis-pool100":
		o := &redis.Options{Addr: addr}
		redisbackend.LowLatency(o)
		if name == "goredis-pool100" {
			o.PoolSize = 100
		}
		rdb := redis.NewClient(o)
		c, err := backendClient(ctx, rdb, rdb.Close)
		if err != nil {
			return nil, err
		}
		opts := rdb.Options()
		c.desc = fmt.Sprintf("go-redis %s, redisbackend.LowLatency, PoolSize %d (GOMAXPROCS %d), PoolTimeout %v, ReadTimeout %v",
			redis.Version(), opts.PoolSize, runtime.GOMAXPROCS(0), opts.PoolTimeout, opts.ReadTimeout)
		return c, nil
	case "rueidis":
		o := rueidis.ClientOption{InitAddress: []string{addr}}
		rueidisbackend.LowLatency(&o)
		ruc, err := rueidis.NewClient(o)
		if err != nil {
			return nil, err
		}
		backend, err := rueidisbackend.New(ruc)
		if err != nil {
			ruc.Close()
			return nil, err
		}
		if _, err := backend.Check(ctx); err != nil {
			ruc.Close()
			return nil, err
		}
		return &client{
			desc:  fmt.Sprintf("rueidis, rueidisbackend.LowLatency, otherwise defaults (GOMAXPROCS %d)", runtime.GOMAXPROCS(0)),
			lim:   ratelimit.New(backend),
			close: ruc.Close,
		}, nil
	}
	return nil, fmt.Errorf("client %q: want one of %s", name, strings.Join(clientNames, ", "))
}

func backendClient(ctx context.Context, rdb *redis.Client, closeFn func() error) (*client, error) {
	backend, err := redisbackend.New(rdb)
	if err != nil {
		closeFn()
		return nil, err
	}
	// Check loads the script, so no measured call sends it.
	if _, err := backend.Check(ctx); err != nil {
		closeFn()
		return nil, err
	}
	return &client{lim: ratelimit.New(backend), close: func() { closeFn() }}, nil
}

func runReplica(f flags) error {
	ctx := context.Background()
	out := json.NewEncoder(os.Stdout)
	clients := map[string]*client{}
	defer func() {
		for _, c := range clients {
			c.close()
		}
	}()
	rd := ready{Clients: map[string]string{}}
	for name := range strings.SplitSeq(f.clients, ",") {
		c, err := newClient(ctx, name, f.redisAddr)
		if err != nil {
			rd.Error = fmt.Sprintf("client %s: %v", name, err)
			return errors.Join(err, out.Encode(rd))
		}
		clients[name] = c
		rd.Clients[name] = c.desc
	}
	if err := out.Encode(rd); err != nil {
		return err
	}
	in := json.NewDecoder(bufio.NewReader(os.Stdin))
	for {
		var cmd command
		if err := in.Decode(&cmd); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if cmd.Quit {
			return nil
		}
		c, ok := clients[cmd.Client]
		if !ok {
			return out.Encode(burstResult{Error: fmt.Sprintf("no client %q", cmd.Client)})
		}
		if err := out.Encode(burst(c.lim, cmd, f.goroutines, f.deadline)); err != nil {
			return err
		}
	}
}

// spinFor is how long before a burst's time a replica stops sleeping and
// spins.
const spinFor = time.Millisecond

// burst starts n goroutines, parks them on a barrier, opens it at cmd.At
// and has each make one decision on cmd.Key.
func burst(lim *ratelimit.Limiter, cmd command, n int, deadline time.Duration) burstResult {
	res := burstResult{
		FromRelease: make([]int64, n),
		Own:         make([]int64, n),
		Errs:        make([]string, n),
		Examples:    map[string]string{},
	}
	allowed := make([]bool, n)
	errs := make([]error, n)
	barrier := make(chan struct{})
	var release time.Time // written before close(barrier), read after it
	var parked, done sync.WaitGroup
	parked.Add(n)
	for i := range n {
		done.Go(func() {
			parked.Done()
			<-barrier
			start := time.Now()
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if deadline > 0 {
				ctx, cancel = context.WithTimeout(ctx, deadline)
			}
			d, err := lim.Allow(ctx, cmd.Key, limit)
			end := time.Now()
			cancel()
			res.FromRelease[i] = int64(end.Sub(release))
			res.Own[i] = int64(end.Sub(start))
			allowed[i], errs[i] = d.Allowed, err
		})
	}
	parked.Wait()
	// Sleep to a millisecond before the time, then spin: a timer alone
	// wakes the two replicas up to a millisecond apart.
	at := time.Unix(0, cmd.At)
	time.Sleep(time.Until(at) - spinFor)
	for time.Now().Before(at) {
	}
	release = time.Now()
	close(barrier)
	done.Wait()
	res.Released = release.UnixNano()
	res.Late = int64(release.Sub(at))
	for i, err := range errs {
		if err != nil {
			kind := errorKind(err)
			res.Errs[i] = kind
			if _, ok := res.Examples[kind]; !ok {
				res.Examples[kind] = err.Error()
			}
			continue
		}
		if allowed[i] {
			res.Admitted++
		}
	}
	return res
}

// errorKind names the kind of a decision's error: sluice's sentinel, and
// what lies beneath it.
func errorKind(err error) string {
	sentinel := "other"
	switch {
	case errors.Is(err, ratelimit.ErrTimeout):
		sentinel = "ErrTimeout"
	case errors.Is(err, ratelimit.ErrBackendUnavailable):
		sentinel = "ErrBackendUnavailable"
	}
	var (
		oe *net.OpError
		ne net.Error
	)
	switch {
	case errors.As(err, &oe) && oe.Op == "dial":
		// A new connection (one closed after a timeout is replaced).
		return sentinel + "/dial"
	case errors.Is(err, redis.ErrPoolTimeout):
		return sentinel + "/pool-timeout"
	case errors.Is(err, context.DeadlineExceeded):
		return sentinel + "/context-deadline"
	case errors.As(err, &ne) && ne.Timeout():
		return sentinel + "/socket-timeout"
	}
	return sentinel + "/other"
}

// --- burner ---

// sink keeps the burner's arithmetic from being optimised away.
var sink atomic.Uint64

// runBurner spins on n threads until its stdin closes.
func runBurner(n int) error {
	if n < 1 {
		return errors.New("-burn must be at least 1")
	}
	runtime.GOMAXPROCS(n)
	for seed := range n {
		go func() {
			x := uint64(seed) + 1
			for {
				for range 1 << 20 {
					x = x*6364136223846793005 + 1442695040888963407
				}
				sink.Store(x)
			}
		}()
	}
	_, err := io.Copy(io.Discard, os.Stdin)
	return err
}

// --- parent ---

// child is a process the parent started, with the pipe to its stdin; it
// exits when the pipe closes.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *json.Decoder
	enc   *json.Encoder
}

func startChild(args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &child{cmd: cmd, stdin: stdin, out: json.NewDecoder(stdout), enc: json.NewEncoder(stdin)}, nil
}

// stop closes the child's stdin and waits for it; after a second it kills
// it.
func (c *child) stop() {
	c.stdin.Close()
	done := make(chan struct{})
	go func() {
		c.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

// server is a redis-server the parent started.
type server struct {
	cmd  *exec.Cmd
	dir  string
	addr string
}

// startServer starts redis-server on a free port of 127.0.0.1 and waits
// until it answers with its own pid.
func startServer(bin string) (*server, error) {
	var lastErr error
	for range 5 {
		s, err := tryServer(bin)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func tryServer(bin string) (*server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "burstlatency-redis-")
	if err != nil {
		return nil, err
	}
	s := &server{dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis-server.log"))
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	want := "process_id:" + strconv.Itoa(s.cmd.Process.Pid)
	for range 100 {
		select {
		case err := <-exited:
			os.RemoveAll(dir)
			return nil, fmt.Errorf("redis-server on port %d exited: %v", port, err)
		case <-time.After(100 * time.Millisecond):
		}
		info, err := rdb.Info(context.Background(), "server").Result()
		if err == nil && strings.Contains(info, want) {
			return s, nil
		}
	}
	s.cmd.Process.Kill()
	<-exited
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redis-server on port %d did not answer", port)
}

func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		s.cmd.Process.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		s.cmd.Process.Kill()
	}
	os.RemoveAll(s.dir)
}

// samples are the results of one client's measured bursts.
type samples struct {
	// fromRelease and own are the latencies of the calls that succeeded;
	// allFromRelease and allOwn those of every call, a failed one at the
	// time it failed.
	fromRelease, own, allFromRelease, allOwn []time.Duration
	// slowest is each burst's slowest call from its replica's release,
	// failed calls included.
	slowest  []time.Duration
	errs     map[string]int
	examples map[string]string
	bursts   []burstSummary
	skew     []time.Duration
	late     []time.Duration
}

// burstSummary is what one burst admitted, across the replicas.
type burstSummary struct {
	admitted, failed int
	// span is from the first replica's release to the last call's return.
	span time.Duration
}

func runParent(f flags) (err error) {
	names := strings.Split(f.clients, ",")
	for _, name := range names {
		if !slices.Contains(clientNames, name) {
			return fmt.Errorf("-clients: %q is not one of %s", name, strings.Join(clientNames, ", "))
		}
	}
	// Children and the server are stopped on the way out; an interrupt
	// only makes the loop stop.
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	addr, serverDesc, serverPid := f.redisAddr, "given with -redis", 0
	if addr == "" {
		s, err := startServer(f.redisServer)
		if err != nil {
			return err
		}
		defer s.stop()
		serverPid = s.cmd.Process.Pid
		addr, serverDesc = s.addr, fmt.Sprintf("started by burstlatency (pid %d): --save \"\" --appendonly no", s.cmd.Process.Pid)
	}
	admin := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer admin.Close()
	version, err := serverVersion(ctx, admin)
	if err != nil {
		return err
	}

	replicas := make([]*child, f.replicas)
	defer func() {
		for _, r := range replicas {
			if r != nil {
				r.enc.Encode(command{Quit: true})
				r.stop()
			}
		}
	}()
	var descs map[string]string
	for i := range replicas {
		r, err := startChild("-role=replica", "-redis="+addr, "-clients="+f.clients,
			"-goroutines="+strconv.Itoa(f.goroutines), "-deadline="+f.deadline.String())
		if err != nil {
			return err
		}
		replicas[i] = r
		var rd ready
		if err := r.out.Decode(&rd); err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
		if rd.Error != "" {
			return fmt.Errorf("replica %d: %s", i, rd.Error)
		}
		descs = rd.Clients
	}

	var burner *child
	if f.burn > 0 {
		burner, err = startChild("-role=burn", "-burn="+strconv.Itoa(f.burn))
		if err != nil {
			return err
		}
		defer burner.stop()
		time.Sleep(time.Second) // let the burner take the CPUs
	}

	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	var keys []string
	defer func() {
		// The buckets live an hour; delete them, in case the server is
		// not ours.
		for chunk := range slices.Chunk(keys, 500) {
			if e := admin.Del(context.Background(), chunk...).Err(); e != nil {
				err = errors.Join(err, fmt.Errorf("delete the keys: %w", e))
				return
			}
		}
	}()

	results := map[string]*samples{}
	for _, name := range names {
		results[name] = &samples{errs: map[string]int{}, examples: map[string]string{}}
	}
	pids := map[string][]int{"parent": {os.Getpid()}}
	for _, r := range replicas {
		pids["replicas"] = append(pids["replicas"], r.cmd.Process.Pid)
	}
	if serverPid > 0 {
		pids["redis-server"] = []int{serverPid}
	}
	if burner != nil {
		pids["burner"] = []int{burner.cmd.Process.Pid}
	}
	var (
		load1   string
		started time.Time
		cpu0    cpuSnapshot
	)
	for round := range f.warmup + f.bursts {
		if round == f.warmup {
			load1, started, cpu0 = loadavg(), time.Now(), snapshotCPU(pids)
		}
		for _, name := range names {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			key := fmt.Sprintf("burstlatency:%s:%s:%d", runID, name, round)
			keys = append(keys, redisscript.Key(redisbackend.DefaultPrefix, key))
			rs, err := runBurst(replicas, command{Client: name, Key: key, At: time.Now().Add(f.lead).UnixNano()})
			if err != nil {
				return err
			}
			if round >= f.warmup {
				results[name].add(rs)
			}
			time.Sleep(f.pause)
		}
	}
	elapsed, cpu1 := time.Since(started), snapshotCPU(pids)

	fmt.Printf("burstlatency: %d replicas × %d goroutines per burst, same fresh key per burst, limit PerSecond(20) + PerHour(1000)\n",
		f.replicas, f.goroutines)
	fmt.Printf("settings: bursts=%d warmup=%d pause=%v lead=%v deadline=%v burn=%d clients=%s\n",
		f.bursts, f.warmup, f.pause, f.lead, f.deadline, f.burn, f.clients)
	fmt.Printf("machine: %s/%s NumCPU=%d %s; load average before %s, after %s; measured for %v\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), load1, loadavg(), elapsed.Round(time.Second))
	fmt.Printf("cpu during the measured bursts, in CPUs busy: %s\n", cpu1.since(cpu0, elapsed))
	fmt.Printf("redis-server %s at %s, %s\n", version, addr, serverDesc)
	for _, name := range names {
		fmt.Printf("client %s: %s\n", name, descs[name])
	}
	fmt.Println()
	report(os.Stdout, names, results)
	return nil
}

// runBurst sends cmd to every replica and collects their results.
func runBurst(replicas []*child, cmd command) ([]burstResult, error) {
	for i, r := range replicas {
		if err := r.enc.Encode(cmd); err != nil {
			return nil, fmt.Errorf("replica %d: %w", i, err)
		}
	}
	rs := make([]burstResult, len(replicas))
	for i, r := range replicas {
		if err := r.out.Decode(&rs[i]); err != nil {
			return nil, fmt.Errorf("replica %d: %w", i, err)
		}
		if rs[i].Error != "" {
			return nil, fmt.Errorf("replica %d: %s", i, rs[i].Error)
		}
	}
	return rs, nil
}

func (s *samples) add(rs []burstResult) {
	var b burstSummary
	first, last := int64(math.MaxInt64), int64(math.MinInt64)
	var slowest time.Duration
	for _, r := range rs {
		b.admitted += r.Admitted
		first = min(first, r.Released)
		s.late = append(s.late, time.Duration(r.Late))
		for i, kind := range r.Errs {
			fromRelease, own := time.Duration(r.FromRelease[i]), time.Duration(r.Own[i])
			s.allFromRelease = append(s.allFromRelease, fromRelease)
			s.allOwn = append(s.allOwn, own)
			slowest = max(slowest, fromRelease)
			last = max(last, r.Released+int64(fromRelease))
			if kind != "" {
				b.failed++
				s.errs[kind]++
				if _, ok := s.examples[kind]; !ok {
					s.examples[kind] = r.Examples[kind]
				}
				continue
			}
			s.fromRelease = append(s.fromRelease, fromRelease)
			s.own = append(s.own, own)
		}
	}
	releaseLast := int64(math.MinInt64)
	for _, r := range rs {
		releaseLast = max(releaseLast, r.Released)
	}
	b.span = time.Duration(last - first)
	s.bursts = append(s.bursts, b)
	s.slowest = append(s.slowest, slowest)
	s.skew = append(s.skew, time.Duration(releaseLast-first))
}

// refillPeriod is the time limit's tightest bandwidth takes to regain a
// token: a burst lasting longer may admit more than admitPerBurst.
const refillPeriod = time.Second / 20

// quantile returns the nearest-rank q-quantile of sorted d.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(d)))) - 1
	return d[max(0, min(i, len(d)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }

// deadlines are the ones the report gives the share of calls over.
var deadlines = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond,
	20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
}

// latencies are one row of the report's table.
type latencies struct {
	label string
	d     []time.Duration
}

// failed is how many calls failed, of every kind.
func (s *samples) failed() int {
	n := 0
	for _, c := range s.errs {
		n += c
	}
	return n
}

func report(w io.Writer, names []string, results map[string]*samples) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "client\tlatency\tsamples\terrors\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmax ms\t")
	for _, name := range names {
		s := results[name]
		nerr := s.failed()
		rows := []latencies{{"from-release", s.fromRelease}, {"own", s.own}}
		if nerr > 0 {
			rows = append(rows, latencies{"from-release+failed", s.allFromRelease}, latencies{"own+failed", s.allOwn})
		}
		rows = append(rows, latencies{"burst-slowest", s.slowest})
		for _, l := range rows {
			slices.Sort(l.d)
			n := nerr
			if l.label == "burst-slowest" {
				n = 0
				for _, b := range s.bursts {
					n += min(b.failed, 1)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, l.label, len(l.d), n,
				ms(quantile(l.d, 0.5)), ms(quantile(l.d, 0.9)), ms(quantile(l.d, 0.99)),
				ms(quantile(l.d, 0.999)), ms(quantile(l.d, 1)))
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "(from-release and own: the calls that succeeded; +failed: every call, a failed one at the time it failed;")
	fmt.Fprintln(w, " burst-slowest: each burst's slowest call from release, failed ones included, one sample per burst, errors = bursts with a failed call)")

	fmt.Fprintln(w)
	fmt.Fprintln(w, "share of calls (errors included, as over) taking more than a deadline:")
	for _, name := range names {
		s := results[name]
		nerr := s.failed()
		total := len(s.own) + nerr
		for _, l := range []latencies{{"from-release", s.fromRelease}, {"own", s.own}} {
			var b strings.Builder
			for _, dl := range deadlines {
				over := len(l.d) - sortedCountAtMost(l.d, dl) + nerr
				fmt.Fprintf(&b, " >%v=%.4f%%", dl, 100*float64(over)/float64(max(total, 1)))
			}
			fmt.Fprintf(w, "over %s %s:%s\n", name, l.label, b.String())
		}
	}

	fmt.Fprintln(w)
	for _, name := range names {
		s := results[name]
		kinds := make([]string, 0, len(s.errs))
		for kind := range s.errs {
			kinds = append(kinds, kind)
		}
		slices.Sort(kinds)
		if len(kinds) == 0 {
			fmt.Fprintf(w, "errors %s: none\n", name)
		}
		for _, kind := range kinds {
			fmt.Fprintf(w, "errors %s: %s count=%d example=%q\n", name, kind, s.errs[kind], s.examples[kind])
		}
	}

	fmt.Fprintln(w)
	for _, name := range names {
		s := results[name]
		dist := map[int]int{}
		admitted := make([]int, len(s.bursts))
		var overBeyond, underUnexplained, overWithin, underWithFailed int
		for i, b := range s.bursts {
			admitted[i] = b.admitted
			dist[b.admitted]++
			switch {
			case b.admitted > admitPerBurst:
				// Each refillPeriod of the burst's span adds a token.
				if b.admitted <= admitPerBurst+int(b.span/refillPeriod) {
					overWithin++
				} else {
					overBeyond++
				}
			case b.admitted < admitPerBurst:
				// A failed call may have taken a token: its reply was lost.
				if b.admitted+b.failed >= admitPerBurst {
					underWithFailed++
				} else {
					underUnexplained++
				}
			}
		}
		counts := make([]int, 0, len(dist))
		for n := range dist {
			counts = append(counts, n)
		}
		slices.Sort(counts)
		var b strings.Builder
		for _, n := range counts {
			fmt.Fprintf(&b, " %d:%d", n, dist[n])
		}
		fmt.Fprintf(w, "admitted %s: bursts=%d want=%d min=%d max=%d per-burst(admitted:bursts)%s\n",
			name, len(admitted), admitPerBurst, slices.Min(admitted), slices.Max(admitted), b.String())
		fmt.Fprintf(w, "admitted %s: over %d: %d within the refill of the burst's span (a token per %v), %d beyond it; under %d: %d with at least as many failed calls (which may have taken a token), %d without\n",
			name, admitPerBurst, overWithin, refillPeriod, overBeyond, admitPerBurst, underWithFailed, underUnexplained)
	}

	fmt.Fprintln(w)
	for _, name := range names {
		s := results[name]
		slices.Sort(s.skew)
		slices.Sort(s.late)
		fmt.Fprintf(w, "sync %s: release skew between replicas p50=%s p99=%s max=%s ms; release after the scheduled time p50=%s p99=%s max=%s ms\n",
			name, ms(quantile(s.skew, 0.5)), ms(quantile(s.skew, 0.99)), ms(quantile(s.skew, 1)),
			ms(quantile(s.late, 0.5)), ms(quantile(s.late, 0.99)), ms(quantile(s.late, 1)))
	}
}

// sortedCountAtMost returns how many of sorted d are at most limit.
func sortedCountAtMost(d []time.Duration, limit time.Duration) int {
	n, _ := slices.BinarySearch(d, limit+1)
	return n
}

func serverVersion(ctx context.Context, rdb *redis.Client) (string, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "unknown", nil
}

// cpuSnapshot is the machine's CPU time so far, and each group of this
// run's processes', in clock ticks; ok is false where /proc cannot tell.
type cpuSnapshot struct {
	ok          bool
	busy, total int64
	groups      map[string]int64
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

func snapshotCPU(pids map[string][]int) cpuSnapshot {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSnapshot{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return cpuSnapshot{}
	}
	s := cpuSnapshot{ok: true, groups: map[string]int64{}}
	// user nice system idle iowait irq softirq steal; guest time is
	// counted in user already.
	for i, f := range fields[1:9] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return cpuSnapshot{}
		}
		s.total += n
		if i != 3 && i != 4 {
			s.busy += n
		}
	}
	for group, ps := range pids {
		for _, pid := range ps {
			n, ok := processTicks(pid)
			if !ok {
				return cpuSnapshot{}
			}
			s.groups[group] += n
		}
	}
	return s
}

// processTicks returns the user and system time of process pid.
func processTicks(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The fields after the command, which is in parentheses: state is
	// the 3rd field, utime the 14th and stime the 15th.
	i := strings.LastIndexByte(string(b), ')')
	fields := strings.Fields(string(b[i+1:]))
	if i < 0 || len(fields) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	return utime + stime, err1 == nil && err2 == nil
}

// since describes the CPU time from s0 to s over elapsed: the machine's,
// each group's, and what the machine spent on other processes.
func (s cpuSnapshot) since(s0 cpuSnapshot, elapsed time.Duration) string {
	if !s.ok || !s0.ok || s.total == s0.total {
		return "unknown"
	}
	cpus := func(ticks int64) float64 { return float64(ticks) / clockTicks / elapsed.Seconds() }
	var b strings.Builder
	fmt.Fprintf(&b, "machine %.2f of %d", float64(runtime.NumCPU())*float64(s.busy-s0.busy)/float64(s.total-s0.total), runtime.NumCPU())
	groups := make([]string, 0, len(s.groups))
	for g := range s.groups {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	var mine int64
	for _, g := range groups {
		mine += s.groups[g] - s0.groups[g]
		fmt.Fprintf(&b, "; %s %.2f", g, cpus(s.groups[g]-s0.groups[g]))
	}
	machine := float64(runtime.NumCPU()) * float64(s.busy-s0.busy) / float64(s.total-s0.total)
	fmt.Fprintf(&b, "; other processes %.2f", max(0, machine-cpus(mine)))
	return b.String()
}

// loadavg returns the first three fields of /proc/loadavg, or "?" where
// there is none.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	fields := strings.Fields(string(b))
	if len(fields) < 3 {
		return "?"
	}
	return strings.Join(fields[:3], " ")
}
