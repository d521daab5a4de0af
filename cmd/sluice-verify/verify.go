package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/test/harness"
)

// setupTimeout bounds each step around the runs: the prefix check, a
// backend's Check, the clean-up.
const setupTimeout = 30 * time.Second

// verify makes the runs o asks for and returns their report. An error
// means the check could not be made at all: no report.
func verify(ctx context.Context, o options, prog *progress) (*report, error) {
	c, err := harness.NewGoRedis(o.server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	setup, cancel := context.WithTimeout(ctx, setupTimeout)
	found, err := harness.Keys(setup, c, o.server.Prefix, 3)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("looking for keys under the prefix %q: %w", o.server.Prefix, err)
	}
	if len(found) > 0 {
		return nil, fmt.Errorf("refusing to run: the server already holds keys under the prefix %q (%s); remove them, or choose another --prefix", o.server.Prefix, strings.Join(found, ", "))
	}

	rep := &report{
		Server:     o.describe,
		Prefix:     o.server.Prefix,
		Processes:  o.processes,
		Goroutines: o.goroutines,
		Calls:      o.calls / o.processes * o.processes,
		Capacity:   o.capacity,
	}
	// From here on keys may exist: clean up whatever happens, even after
	// an interrupt.
	defer func() {
		clean, cancel := context.WithTimeout(context.WithoutCancel(ctx), setupTimeout)
		defer cancel()
		rep.KeysDeleted, rep.KeysLeft, rep.CleanError = cleanUp(clean, c, o.server.Prefix)
	}()

	for _, adapter := range o.adapters {
		rep.Adapters = append(rep.Adapters, check(ctx, o, adapter))
	}
	total := len(o.adapters) * len(o.buckets)
	for _, adapter := range o.adapters {
		for _, b := range o.buckets {
			if ctx.Err() != nil {
				break
			}
			r := measure(ctx, o, adapter, b, prog.run(len(rep.Runs)+1, total, adapter+" "+b.Name))
			rep.Runs = append(rep.Runs, r)
		}
	}
	rep.Interrupted = ctx.Err() != nil
	return rep, nil
}

// check runs the backend's Check for adapter.
func check(ctx context.Context, o options, adapter string) harness.AdapterReport {
	conn, err := harness.Connect(harness.Spec{Backend: adapter, Server: o.server})
	if err != nil {
		return harness.AdapterReport{Name: adapter, CheckError: err.Error()}
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	return harness.CheckAdapter(ctx, adapter, conn.Settings, conn.Check)
}

// measure makes one run: o's processes on a new bucket b through adapter.
func measure(ctx context.Context, o options, adapter string, b harness.Bucket, p *runProgress) runReport {
	spec := harness.Spec{
		Backend:    adapter,
		Server:     o.server,
		Key:        adapter + ":" + b.Name,
		Config:     b.Config(),
		Goroutines: o.goroutines,
		Attempts:   o.calls / o.processes,
		Timeout:    o.timeout,
	}
	res, err := harness.Measure(ctx, harness.Run{
		Program: o.instance, Processes: o.processes, Spec: spec,
		Drive: func(in *harness.Instances) error {
			p.start(in, spec.Attempts*o.processes)
			return in.Go()
		},
	})
	p.stop()
	r := harness.NewRunReport(adapter, b, res, err)
	p.done(r)
	return r
}

// cleanUp deletes the run's keys and counts those left under the prefix;
// if it fails, it says why.
func cleanUp(ctx context.Context, c redis.UniversalClient, prefix string) (deleted, left int, failed string) {
	deleted, err := harness.Clean(ctx, c, prefix)
	if err != nil {
		return deleted, 0, err.Error()
	}
	keys, err := harness.Keys(ctx, c, prefix, 0)
	if err != nil {
		return deleted, 0, err.Error()
	}
	return deleted, len(keys), ""
}

// progress writes the progress line on stderr: on a terminal, one line
// rewritten as the calls go; elsewhere, a line as each run ends.
type progress struct {
	w        io.Writer
	terminal bool
	quiet    bool
}

func newProgress(w io.Writer, quiet bool) *progress {
	terminal := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil {
			terminal = fi.Mode()&os.ModeCharDevice != 0
		}
	}
	return &progress{w: w, terminal: terminal, quiet: quiet}
}

// runProgress is the progress of one run. start and stop are called from
// the run's goroutine (Measure calls Drive on its own).
type runProgress struct {
	p       *progress
	label   string
	stopped chan struct{} // closed by stop; nil unless started
	wg      sync.WaitGroup
}

// run starts the progress of run i of total.
func (p *progress) run(i, total int, what string) *runProgress {
	return &runProgress{p: p, label: fmt.Sprintf("[%d/%d] %s", i, total, what)}
}

// start shows in's calls as they go, on a terminal, until stop.
func (rp *runProgress) start(in *harness.Instances, calls int) {
	if rp.p.quiet || !rp.p.terminal {
		return
	}
	rp.stopped = make(chan struct{})
	rp.wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			fmt.Fprintf(rp.p.w, "\r\033[K%s: %d/%d calls", rp.label, in.Returned(), calls)
			select {
			case <-rp.stopped:
				return
			case <-tick.C:
			}
		}
	})
}

// stop ends what start began.
func (rp *runProgress) stop() {
	if rp.stopped != nil {
		close(rp.stopped)
		rp.wg.Wait()
		rp.stopped = nil
	}
}

// done reports the end of the run.
func (rp *runProgress) done(r runReport) {
	if rp.p.quiet {
		return
	}
	line := fmt.Sprintf("%s: %s, admitted %d of [%d, %d]", rp.label, r.Verdict, r.Admitted, r.Bound.Low, r.Bound.High)
	if r.Verdict == verdictError {
		line = fmt.Sprintf("%s: %s", rp.label, r.Error)
	}
	if rp.p.terminal {
		fmt.Fprintf(rp.p.w, "\r\033[K%s\n", line)
		return
	}
	fmt.Fprintln(rp.p.w, line)
}
