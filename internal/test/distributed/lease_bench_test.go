package distributed_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
)

// leasedProcesses is how many OS processes share the hot key.
const leasedProcesses = 2

// leasedTick is the load one b.N stands for: a row runs its processes for
// b.N × leasedTick, at least leasedMinWindow, so that both make calls
// through all of it (a count of calls split between them would leave the
// faster one idle at the end). -benchtime 20000x, as
// benchmarks/hotkey.sh passes, is 2s a row.
const leasedTick = 100 * time.Microsecond

// leasedMinWindow is the shortest window: the b.N = 1 run that the
// testing package starts with would otherwise end before an unleased
// call it saw start returns.
const leasedMinWindow = 20 * time.Millisecond

// leasedWarmup is how long a process makes calls before it says it is
// ready, and goes on making them until the window starts: the pool's
// connections dialled, the script loaded, the lease sized to the load.
const leasedWarmup = 200 * time.Millisecond

// leasedBandwidth is the hot key's limit. A bandwidth refills at most one
// token a µs, and the leased rows decide more than a million a second, so
// that every call is allowed the burst is far above what a run takes, as
// BenchmarkHotKey's is. The store then falls further short of full all
// through a run, and a lease's tokens do not lapse before they are spent
// (a lease lapses as the store could refill past it: see package lease).
var leasedBandwidth = ratelimit.PerSecond(1e6).WithBurst(1 << 40)

// BenchmarkHotKeyLeased measures one hot key shared by two OS processes
// on one standalone redis-server, in one run, with and without the lease
// decorator: for go-redis (a pool as large as the goroutines, its
// autopipeliner on: the backend's defaults) and rueidis (its defaults,
// client-side caching off), at 16 and 64 goroutines a process:
//
//   - lease=off: the backend on its own, every decision one store call;
//   - lease=on: lease.New over the same backend, with the key leased at
//     DefaultTarget and DefaultMaxShare.
//
// Each row starts its two processes (this test binary, made a child by
// the leasedChildEnv variable; see init), lets them warm up, and then
// has both make Consumes of one token from all their goroutines for
// b.N × leasedTick. It reports the decisions a second of both together,
// their p50 and p99 (from a log-linear histogram, within 1/16), the
// store calls per decision (counted below the lease), and for context
// the tokens those calls took from the bucket per decision (with leases,
// off 1 by what they held as the window started and as it ended, and by
// what lapsed) and the CPU time per decision of the server (INFO cpu)
// and of the two processes (getrusage). ns/op is the wall time per
// decision of the two together, 1/(decisions/s), since b.N counts time,
// not calls. A row fails if any call fails or is denied.
//
// The processes and the server share this machine's cores.
//
//	go test -run '^$' -bench HotKeyLeased -benchtime 20000x -count 6 ./internal/test/distributed | benchstat -col /lease -
func BenchmarkHotKeyLeased(b *testing.B) {
	addr := servers.StartRedis(b).Addr()
	cpu := masterCPU(b, []string{addr})
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	for _, client := range []string{harness.BackendGoRedis, harness.BackendRueidis} {
		for _, goroutines := range []int{16, 64} {
			for _, leased := range []bool{false, true} {
				name := fmt.Sprintf("client=%s/goroutines=%d/lease=%s", client, goroutines, map[bool]string{false: "off", true: "on"}[leased])
				b.Run(name, func(b *testing.B) {
					job := leasedJob{Addr: addr, Client: client, Goroutines: goroutines, Lease: leased, Window: max(time.Duration(b.N)*leasedTick, leasedMinWindow)}
					benchHotKeyLeased(b, exe, job, cpu)
				})
			}
		}
	}
}

// benchHotKeyLeased runs job in leasedProcesses children of the binary
// exe on a key of its own, and reports their figures.
func benchHotKeyLeased(b *testing.B, exe string, job leasedJob, cpu func() []time.Duration) {
	job.Key = fmt.Sprintf("hotkey-leased:%s:%d:%t:%d", job.Client, job.Goroutines, job.Lease, time.Now().UnixNano())
	children := make([]*leasedChild, leasedProcesses)
	for i := range children {
		children[i] = startLeasedChild(b, exe, job)
	}
	for _, c := range children {
		c.ready(b)
	}
	cpu0 := cpu()
	b.ResetTimer()
	for _, c := range children {
		c.start(b)
	}
	reports := make([]leasedReport, len(children))
	for i, c := range children {
		reports[i] = c.finish(b)
	}
	b.StopTimer()
	server := cpu()[0] - cpu0[0]

	var (
		sum     leasedReport
		perSec  float64
		latency latencyHistogram
	)
	for _, r := range reports {
		sum.Decisions += r.Decisions
		sum.Denied += r.Denied
		sum.Errors += r.Errors
		sum.StoreCalls += r.StoreCalls
		sum.StoreTokens += r.StoreTokens
		sum.CPU += r.CPU
		if sum.FirstError == "" {
			sum.FirstError = r.FirstError
		}
		perSec += float64(r.Decisions) / r.Elapsed.Seconds()
		latency.merge(&r.Latency)
	}
	switch {
	case sum.Errors > 0:
		b.Fatalf("%d calls failed; the first: %s", sum.Errors, sum.FirstError)
	case sum.Denied > 0:
		b.Fatalf("%d calls denied; every call must be allowed", sum.Denied)
	case sum.Decisions == 0:
		b.Fatalf("no decision in %v", job.Window)
	}
	n := float64(sum.Decisions)
	b.ReportMetric(1e9/perSec, "ns/op")
	b.ReportMetric(perSec, "decisions/s")
	b.ReportMetric(latency.quantile(0.50).Seconds()*1e6, "p50-µs")
	b.ReportMetric(latency.quantile(0.99).Seconds()*1e6, "p99-µs")
	b.ReportMetric(float64(sum.StoreCalls)/n, "store-calls/decision")
	b.ReportMetric(float64(sum.StoreTokens)/n, "store-tokens/decision")
	b.ReportMetric(float64(server.Nanoseconds())/1e3/n, "server-cpu-µs/op")
	b.ReportMetric(float64(sum.CPU.Nanoseconds())/1e3/n, "client-cpu-µs/op")
}

// leasedChildEnv, set in its environment, makes the test binary a child
// of BenchmarkHotKeyLeased rather than a test run: init reads a
// leasedJob from stdin, makes its calls, writes its leasedReport to
// stdout, and exits, before TestMain is reached. The variable's value
// does not matter.
const leasedChildEnv = "SLUICE_HOTKEY_LEASED_CHILD"

func init() {
	if _, ok := os.LookupEnv(leasedChildEnv); !ok {
		return
	}
	if err := runLeasedChild(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "hotkey-leased child %d: %v\n", os.Getpid(), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// leasedJob is what a child does, sent on its stdin.
type leasedJob struct {
	Addr       string
	Client     string // harness.BackendGoRedis or harness.BackendRueidis
	Goroutines int
	Lease      bool
	Key        string
	Window     time.Duration
}

// leasedReport is what a child did in its window, written to its stdout.
// Denied and Errors count every call of its life, warm-up included.
type leasedReport struct {
	Decisions      int64
	Denied, Errors int64
	FirstError     string
	StoreCalls     int64
	StoreTokens    int64         // what StoreCalls took from the bucket
	Elapsed        time.Duration // from the start of the window until its last call returned
	CPU            time.Duration // the process's user and system time in that span
	Latency        latencyHistogram
}

// leasedReady is a child's word that it has warmed up; leasedGo the
// parent's that the window starts.
type (
	leasedReady struct{ Ready bool }
	leasedGo    struct{ Go bool }
)

// leasedChild is one child process, seen from the parent.
type leasedChild struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *json.Decoder
	stderr bytes.Buffer
	exited bool
}

// startLeasedChild starts a child of exe and sends it job. t.Cleanup
// kills it if the run ends before it has exited.
func startLeasedChild(t testing.TB, exe string, job leasedJob) *leasedChild {
	t.Helper()
	c := &leasedChild{cmd: exec.Command(exe)}
	c.cmd.Env = append(os.Environ(), leasedChildEnv+"=1")
	c.cmd.SysProcAttr = harness.SysProcAttr()
	c.cmd.Stderr = &c.stderr
	in, err := c.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.in, c.out = in, json.NewDecoder(out)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !c.exited {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	if err := json.NewEncoder(c.in).Encode(job); err != nil {
		c.fail(t, "send the job", err)
	}
	return c
}

// ready waits for c to have warmed up.
func (c *leasedChild) ready(t testing.TB) {
	t.Helper()
	var r leasedReady
	if err := c.out.Decode(&r); err != nil || !r.Ready {
		c.fail(t, "wait for it to be ready", err)
	}
}

// start starts c's window.
func (c *leasedChild) start(t testing.TB) {
	t.Helper()
	if err := json.NewEncoder(c.in).Encode(leasedGo{Go: true}); err != nil {
		c.fail(t, "start its window", err)
	}
}

// finish returns c's report once it has exited.
func (c *leasedChild) finish(t testing.TB) leasedReport {
	t.Helper()
	var r leasedReport
	if err := c.out.Decode(&r); err != nil {
		c.fail(t, "read its report", err)
	}
	c.in.Close()
	err := c.cmd.Wait()
	c.exited = true
	if err != nil {
		t.Fatalf("child %d: %v; stderr:\n%s", c.cmd.Process.Pid, err, c.stderr.String())
	}
	return r
}

// fail ends the run at a broken exchange with c, with what c wrote to
// stderr before it exited.
func (c *leasedChild) fail(t testing.TB, step string, err error) {
	t.Helper()
	c.in.Close()
	werr := c.cmd.Wait() // stderr is complete only once it has exited
	c.exited = true
	t.Fatalf("child %d: %s: %v (exit: %v); stderr:\n%s", c.cmd.Process.Pid, step, err, werr, c.stderr.String())
}

// runLeasedChild is a child's life: it reads a leasedJob from in, makes
// calls from job.Goroutines goroutines until told to stop, says on out
// when it is ready and then what it did in its window.
func runLeasedChild(in io.Reader, out io.Writer) error {
	cmds, replies := json.NewDecoder(in), json.NewEncoder(out)
	var job leasedJob
	if err := cmds.Decode(&job); err != nil {
		return fmt.Errorf("read the job: %w", err)
	}
	store, closeStore, err := benchStore(job.Client, []string{job.Addr}, job.Goroutines)
	if err != nil {
		return err
	}
	defer closeStore()
	counted := &countedStore{next: store}
	var backend ratelimit.Backend = counted
	if job.Lease {
		leased, err := lease.New(counted, lease.Keys(job.Key), lease.WithTarget(lease.DefaultTarget), lease.WithMaxShare(lease.DefaultMaxShare))
		if err != nil {
			return err
		}
		defer leased.Close()
		backend = leased
	}

	l := &hotKeyLoad{backend: backend, key: job.Key, cfg: ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{leasedBandwidth}}}
	l.start(job.Goroutines)
	time.Sleep(leasedWarmup)
	if err := replies.Encode(leasedReady{Ready: true}); err != nil {
		l.stop()
		return err
	}
	var g leasedGo
	if err := cmds.Decode(&g); err != nil || !g.Go {
		l.stop()
		return fmt.Errorf("wait for the window: %v", err)
	}

	calls0, tokens0, cpu0, t0 := counted.calls.Load(), counted.tokens.Load(), processCPU(), time.Now()
	l.phase.Store(phaseMeasure)
	time.Sleep(job.Window)
	l.stop()
	elapsed, cpu := time.Since(t0), processCPU()-cpu0
	r := l.report()
	r.Elapsed, r.CPU = elapsed, cpu
	r.StoreCalls, r.StoreTokens = counted.calls.Load()-calls0, counted.tokens.Load()-tokens0
	return replies.Encode(r)
}

// The phases of a hotKeyLoad.
const (
	phaseWarm    int32 = iota // calls made, not counted
	phaseMeasure              // calls counted as they return
	phaseStop                 // no new call; those out are counted
)

// hotKeyLoad makes Consumes of one token on key from many goroutines.
type hotKeyLoad struct {
	backend ratelimit.Backend
	key     string
	cfg     ratelimit.Config
	phase   atomic.Int32
	wg      sync.WaitGroup

	mu  sync.Mutex
	sum leasedReport
}

// start starts goroutines goroutines making calls until stop.
func (l *hotKeyLoad) start(goroutines int) {
	for range goroutines {
		l.wg.Go(l.run)
	}
}

// stop stops the calls and returns once the last has returned.
func (l *hotKeyLoad) stop() {
	l.phase.Store(phaseStop)
	l.wg.Wait()
}

// report is what the goroutines did, once stopped.
func (l *hotKeyLoad) report() leasedReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sum
}

// run is one goroutine's calls. It counts a call, and its latency, if it
// returns once the window has started, as countedStore counts the store
// calls: a call out as the window starts is counted, and so is every
// call out as it ends, which stop waits for.
func (l *hotKeyLoad) run() {
	ctx := context.Background()
	req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	var mine leasedReport
	for l.phase.Load() != phaseStop {
		t0 := time.Now()
		d, err := l.backend.Do(ctx, l.key, l.cfg, req)
		took := time.Since(t0)
		switch {
		case err != nil:
			mine.Errors++
			if mine.FirstError == "" {
				mine.FirstError = err.Error()
			}
		case !d.Allowed:
			mine.Denied++
		}
		if l.phase.Load() != phaseWarm {
			mine.Decisions++
			mine.Latency.add(took)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sum.Decisions += mine.Decisions
	l.sum.Denied += mine.Denied
	l.sum.Errors += mine.Errors
	if l.sum.FirstError == "" {
		l.sum.FirstError = mine.FirstError
	}
	l.sum.Latency.merge(&mine.Latency)
}

// countedStore counts the calls that reach the store (below a lease its
// refills, on its own every decision) and the tokens they take, as they
// return.
type countedStore struct {
	next          ratelimit.Backend
	calls, tokens atomic.Int64
}

func (c *countedStore) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	d, err := c.next.Do(ctx, key, cfg, req)
	c.calls.Add(1)
	if err == nil {
		c.tokens.Add(d.Consumed)
	}
	return d, err
}

// processCPU is the user and system time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// latencySub is the sub-buckets per power of two of a latencyHistogram:
// a quantile it gives is at most 1/latencySub above the true one.
const latencySub = 16

// latencyHistogram counts latencies in ns, exactly below 2·latencySub
// ns, above that in latencySub buckets per power of two.
type latencyHistogram [(64 - 3) * latencySub]int64

// latencyBucket is the bucket of ns.
func latencyBucket(ns int64) int {
	v := uint64(max(ns, 0))
	if v < 2*latencySub {
		return int(v)
	}
	shift := bits.Len64(v) - bits.Len64(2*latencySub-1) // v>>shift in [latencySub, 2·latencySub)
	return (shift+1)*latencySub + int(v>>shift) - latencySub
}

// latencyCeiling is the largest ns of bucket i.
func latencyCeiling(i int) int64 {
	if i < 2*latencySub {
		return int64(i)
	}
	shift := i/latencySub - 1
	m := int64(i%latencySub + latencySub)
	return (m+1)<<shift - 1
}

func (h *latencyHistogram) add(d time.Duration) { h[latencyBucket(d.Nanoseconds())]++ }

func (h *latencyHistogram) merge(o *latencyHistogram) {
	for i, n := range o {
		h[i] += n
	}
}

// quantile is the latency that a share q of the counted ones do not
// exceed, to within its bucket (rounded up).
func (h *latencyHistogram) quantile(q float64) time.Duration {
	var total int64
	for _, n := range h {
		total += n
	}
	rank := max(1, int64(q*float64(total)+0.5))
	var seen int64
	for i, n := range h {
		if seen += n; seen >= rank {
			return time.Duration(latencyCeiling(i))
		}
	}
	return 0
}
