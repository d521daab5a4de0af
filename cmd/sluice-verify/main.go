// Command sluice-verify checks that sluice's limits hold exactly on your
// own Redis: a managed service, a proxy in front of a cluster, a Sentinel
// setup, a Valkey server. It starts several processes of itself (two by
// default), each with many goroutines, that share one bucket per
// algorithm and Redis adapter (go-redis and rueidis), and checks that the
// count they were admitted in all is the bucket's capacity, plus what it
// refilled over the run by the server's clock, never more. This is the
// test of running two instances of an application against one Redis and
// seeing that they admit the capacity, not double it, made with the
// harness of sluice's own distributed tests.
//
// Usage:
//
//	go run github.com/sluicehq/sluice/cmd/sluice-verify@latest --redis HOST:PORT
//	sluice-verify --cluster HOST:PORT,HOST:PORT,... [flags]
//	sluice-verify --sentinel HOST:PORT,... --master NAME [flags]
//
// It also reports, for each adapter, what the backend's Check finds (each
// server's version and maxmemory-policy, the client's retry and deadline
// settings), the errors and the latency percentiles of the calls. Every
// key it makes starts with --prefix (sluice-verify: by default); it
// refuses to run when the server already holds a key under that prefix,
// touches no other key, and deletes every key it made before it exits.
//
// The report is a table on stdout, or JSON with --json; a progress line
// goes to stderr while it runs. The exit status is 0 when every bound
// held, 1 when a bound was broken or a call failed (or, with --strict,
// when Check found a problem), and 2 when it could not run (bad flags, a
// server it cannot reach, keys already under the prefix, an interrupt) or
// could not remove every key it made. See docs/verify.md for how to read
// the report.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redisconn"
	"github.com/sluicehq/sluice/internal/test/harness"
)

func main() {
	redis.SetLogger(quiet{})
	if harness.IsInstance() {
		harness.InstanceMain(harness.Connect)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// quiet drops go-redis's log lines: its failover client writes two for
// each client it connects, a dozen a run, and the report says what went
// wrong.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Exit statuses.
const (
	exitOK     = 0 // every bound held
	exitBroken = 1 // a bound broken, a call failed, or (--strict) a problem found
	exitCannot = 2 // bad flags, the check could not run, or its keys could not all be removed
)

// options are the parsed flags.
type options struct {
	server              harness.Server
	processes           int
	goroutines          int
	calls               int
	capacity            int64
	buckets             []harness.Bucket
	adapters            []string
	timeout             time.Duration
	json, strict, quiet bool
	describe            string // where the server is, in words
	instance            harness.Program
}

// errUsage marks an error in the flags, which parse has already reported.
var errUsage = errors.New("usage")

// hiddenFlags are for sluice's own tests, and left out of the usage.
var hiddenFlags = map[string]bool{"test-racy-store": true}

// parse reads the flags in args.
func parse(args []string, stderr io.Writer) (options, error) {
	var (
		o                            options
		redisAddr, cluster, sentinel string
		buckets, adapters            string
		useTLS                       bool
		tlsOpts                      redisconn.TLS
		racy                         bool
	)
	fs := flag.NewFlagSet("sluice-verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&redisAddr, "redis", "", "`host:port` of a standalone server (or a proxy that looks like one)")
	fs.StringVar(&cluster, "cluster", "", "comma-separated `host:port` seeds of a Redis Cluster")
	fs.StringVar(&sentinel, "sentinel", "", "comma-separated `host:port` of Sentinels; needs --master")
	fs.StringVar(&o.server.Sentinel, "master", "", "the `name` the Sentinels know the master by")
	fs.IntVar(&o.server.DB, "db", 0, "database `number` to SELECT (standalone and Sentinel)")
	fs.StringVar(&o.server.Username, "username", "", "ACL `user` for AUTH")
	fs.StringVar(&o.server.Password, "password", os.Getenv("REDISCLI_AUTH"), "`password` for AUTH (default $REDISCLI_AUTH, as redis-cli takes it)")
	fs.StringVar(&o.server.SentinelUsername, "sentinel-username", "", "ACL `user` for the Sentinels")
	fs.StringVar(&o.server.SentinelPassword, "sentinel-password", "", "`password` for the Sentinels")
	fs.BoolVar(&useTLS, "tls", false, "connect with TLS (implied by any --tls-* flag)")
	fs.StringVar(&tlsOpts.CAFile, "tls-ca", "", "PEM `file` of the CA certificates that verify the servers (default: the system's)")
	fs.StringVar(&tlsOpts.CertFile, "tls-cert", "", "PEM `file` of the client certificate, for servers that ask for one")
	fs.StringVar(&tlsOpts.KeyFile, "tls-key", "", "PEM `file` of the client certificate's key")
	fs.StringVar(&tlsOpts.ServerName, "tls-server-name", "", "`name` to verify the servers' certificates against (default: each address's host)")
	fs.BoolVar(&tlsOpts.InsecureSkipVerify, "tls-insecure-skip-verify", false, "accept any server certificate")
	fs.StringVar(&o.server.Prefix, "prefix", "sluice-verify:", "key `prefix` of every key the run makes; the server must hold none")
	fs.IntVar(&o.processes, "processes", 2, "instance processes sharing each bucket")
	fs.IntVar(&o.goroutines, "goroutines", 64, "goroutines making calls in each process")
	fs.IntVar(&o.calls, "calls", 5000, "calls on each bucket, shared evenly by the processes")
	fs.Int64Var(&o.capacity, "capacity", 1000, "capacity of each bucket")
	fs.StringVar(&buckets, "buckets", "", "comma-separated buckets to check (default all: "+strings.Join(bucketNames(), ",")+")")
	fs.StringVar(&adapters, "adapters", harness.BackendGoRedis+","+harness.BackendRueidis, "comma-separated Redis adapters: goredis (backend/redis), rueidis (backend/rueidis)")
	fs.IntVar(&o.server.Retries, "retries", 0, "retries of a command after a network error, as the client's setting (go-redis's default is 3; sluice advises 0)")
	noContextTimeout := fs.Bool("no-context-timeout", false, "leave go-redis's ContextTimeoutEnabled off, as its default does")
	fs.BoolVar(&o.server.LowLatency, "low-latency", false, "build the clients with the backends' LowLatency helpers (docs/operations.md)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "deadline of each call")
	fs.BoolVar(&o.json, "json", false, "write the report as JSON")
	fs.BoolVar(&o.strict, "strict", false, "exit 1 also when Check finds a problem")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress line on stderr")
	fs.BoolVar(&racy, "test-racy-store", false, "")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: sluice-verify (--redis ADDR | --cluster ADDR,... | --sentinel ADDR,... --master NAME) [flags]\n\n"+
			"Checks that sluice's limits hold exactly on a Redis: see docs/verify.md.\n\nFlags:\n")
		fs.VisitAll(func(f *flag.Flag) {
			if hiddenFlags[f.Name] {
				return
			}
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(stderr, "  --%s", f.Name)
			if name != "" {
				fmt.Fprintf(stderr, " %s", name)
			}
			fmt.Fprintf(stderr, "\n    \t%s", usage)
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && !strings.Contains(usage, "(default") {
				fmt.Fprintf(stderr, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(stderr)
		})
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, errUsage
	}
	o.server.NoContextTimeout = *noContextTimeout
	fail := func(format string, a ...any) (options, error) {
		fmt.Fprintf(stderr, "sluice-verify: "+format+"\n(sluice-verify --help lists the flags)\n", a...)
		return o, errUsage
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	given := 0
	for _, s := range []string{redisAddr, cluster, sentinel} {
		if s != "" {
			given++
		}
	}
	if given != 1 {
		return fail("give exactly one of --redis, --cluster and --sentinel")
	}
	switch {
	case redisAddr != "":
		o.server.Addrs = []string{redisAddr}
		o.describe = "standalone " + redisAddr
	case cluster != "":
		o.server.Addrs, o.server.Cluster = splitList(cluster), true
		o.describe = "cluster " + strings.Join(o.server.Addrs, ",")
	default:
		o.server.Addrs = splitList(sentinel)
		o.describe = fmt.Sprintf("Sentinel master %q via %s", o.server.Sentinel, strings.Join(o.server.Addrs, ","))
	}
	if sentinel != "" && o.server.Sentinel == "" {
		return fail("--sentinel needs --master, the name the Sentinels know the master by")
	}
	if sentinel == "" && o.server.Sentinel != "" {
		return fail("--master is for --sentinel")
	}
	if cluster != "" && o.server.DB != 0 {
		return fail("--db %d: a cluster has only database 0", o.server.DB)
	}
	if slices.Contains(o.server.Addrs, "") {
		return fail("an empty address in the list")
	}
	if useTLS || tlsOpts != (redisconn.TLS{}) {
		o.server.TLS = &tlsOpts
	}
	switch {
	case o.server.Prefix == "":
		return fail("--prefix must not be empty: the run must be able to tell its keys from every other")
	case o.server.DB < 0:
		return fail("--db %d: want 0 or more", o.server.DB)
	case o.processes < 1 || o.processes > 64:
		return fail("--processes %d: want 1 to 64", o.processes)
	case o.goroutines < 1 || o.goroutines > 4096:
		return fail("--goroutines %d: want 1 to 4096", o.goroutines)
	case o.calls < o.processes:
		return fail("--calls %d: want at least one a process (--processes %d)", o.calls, o.processes)
	case o.capacity < 1:
		return fail("--capacity %d: want 1 or more", o.capacity)
	case o.server.Retries < 0:
		return fail("--retries %d: want 0 or more", o.server.Retries)
	case o.timeout <= 0:
		return fail("--timeout %v: want more than 0", o.timeout)
	}
	o.buckets = harness.Buckets(o.capacity)
	if buckets != "" {
		var picked []harness.Bucket
		for _, name := range splitList(buckets) {
			i := slices.IndexFunc(o.buckets, func(b harness.Bucket) bool { return strings.EqualFold(b.Name, name) })
			if i < 0 {
				return fail("--buckets: no bucket %q; the buckets are %s", name, strings.Join(bucketNames(), ","))
			}
			picked = append(picked, o.buckets[i])
		}
		o.buckets = picked
	}
	for _, b := range o.buckets {
		if err := b.Config().Validate(); err != nil {
			return fail("--capacity %d: bucket %s: %v", o.capacity, b.Name, err)
		}
	}
	o.adapters = splitList(adapters)
	for _, a := range o.adapters {
		if a != harness.BackendGoRedis && a != harness.BackendRueidis {
			return fail("--adapters: %q is not %s or %s", a, harness.BackendGoRedis, harness.BackendRueidis)
		}
	}
	if racy {
		o.adapters = []string{harness.BackendRacy}
	}
	return o, nil
}

// bucketNames names the buckets --buckets may pick.
func bucketNames() []string {
	var names []string
	for _, b := range harness.Buckets(1) {
		names = append(names, b.Name)
	}
	return names
}

// splitList splits a comma-separated list, trimming spaces.
func splitList(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		out = append(out, strings.TrimSpace(part))
	}
	return out
}

// run is the command, with its exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case err != nil:
		return exitCannot
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "sluice-verify: finding this program to start its instances: %v\n", err)
		return exitCannot
	}
	o.instance = harness.Program{Path: self}
	rep, err := verify(ctx, o, newProgress(stderr, o.quiet))
	if err != nil {
		fmt.Fprintf(stderr, "sluice-verify: %v\n", err)
		return exitCannot
	}
	if o.json {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice-verify: writing the report: %v\n", err)
		return exitCannot
	}
	return exitStatus(rep, o.strict)
}
