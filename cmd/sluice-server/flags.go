package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlsconfig"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/redisconn"
)

// Defaults of the flags.
const (
	defaultGRPC     = ":8081"
	defaultHTTP     = ":8080"
	defaultFailMode = "error"
	defaultPrefix   = "sluice-server:"
	// defaultTimeout is the fail policy's deadline of a decision on Redis:
	// failpolicy's default, which a healthy Redis meets on a loaded 2-core
	// machine.
	defaultTimeout = failpolicy.DefaultTimeout
)

// options are the server's settings, as its flags give them.
type options struct {
	config   string // file or directory; "" for the example config
	grpcAddr string
	httpAddr string

	// redis is the Redis deployment to keep buckets in; no Addrs for
	// memory. client is "go-redis" or "rueidis".
	redis  redisconn.Server
	client string
	prefix string

	failMode  string
	timeout   time.Duration
	replicas  int
	shadow    bool
	quota     bool
	metadata  bool
	headers   httplimit.Headers
	postgres  string
	maxKeys   int
	logFormat string
	grpcTLS   serverTLS
}

// headerChoices are --response-headers' values.
var headerChoices = map[string]httplimit.Headers{
	"ietf": httplimit.IETFHeaders,
	"x":    httplimit.XRateLimitHeaders,
	"both": httplimit.IETFHeaders | httplimit.XRateLimitHeaders,
	"none": 0,
}

// parseFlags reads the command line (without the program name). Usage and
// flag syntax errors go to output; the error returned names the flag at
// fault.
func parseFlags(args []string, output io.Writer) (options, error) {
	fs := flag.NewFlagSet("sluice-server", flag.ContinueOnError)
	fs.SetOutput(output)
	o := options{}
	var redisAddr, cluster, sentinel, headers string
	var useTLS bool
	var tlsOpts redisconn.TLS
	fs.StringVar(&o.config, "config", "", "the limits: a YAML `file`, or a directory of them, reloaded when they change (default: the example config built in)")
	fs.StringVar(&o.grpcAddr, "grpc", defaultGRPC, "serve the RLS v3 gRPC API, health and reflection at this `address`")
	fs.StringVar(&o.httpAddr, "http", defaultHTTP, "serve /metrics (Prometheus) and /healthcheck at this `address`")
	fs.StringVar(&redisAddr, "redis", "", "keep buckets in the standalone Redis at this `host:port` instead of in memory")
	fs.StringVar(&cluster, "cluster", "", "keep buckets in the Redis Cluster of these comma-separated `host:port` seeds")
	fs.StringVar(&sentinel, "sentinel", "", "keep buckets in the master these comma-separated Sentinel `host:port`s know as --master")
	fs.StringVar(&o.redis.Sentinel, "master", "", "the `name` the Sentinels know the master by")
	fs.StringVar(&o.client, "client", "go-redis", "the Redis `client`: go-redis or rueidis")
	fs.StringVar(&o.prefix, "prefix", defaultPrefix, "key `prefix` of every bucket in Redis")
	fs.IntVar(&o.redis.DB, "db", 0, "database `number` to SELECT (standalone and Sentinel)")
	fs.StringVar(&o.redis.Username, "username", "", "ACL `user` for AUTH")
	fs.StringVar(&o.redis.Password, "password", os.Getenv("REDISCLI_AUTH"), "`password` for AUTH (default $REDISCLI_AUTH)")
	fs.BoolVar(&useTLS, "tls", false, "connect to Redis with TLS (implied by any --tls-* flag)")
	fs.StringVar(&tlsOpts.CAFile, "tls-ca", "", "PEM `file` of the CA certificates that verify the Redis servers")
	fs.StringVar(&tlsOpts.CertFile, "tls-cert", "", "PEM `file` of the client certificate")
	fs.StringVar(&tlsOpts.KeyFile, "tls-key", "", "PEM `file` of the client certificate's key")
	fs.StringVar(&o.grpcTLS.cert, "grpc-tls-cert", "", "serve gRPC over TLS with the certificate in this PEM `file` (read again when it changes)")
	fs.StringVar(&o.grpcTLS.key, "grpc-tls-key", "", "PEM `file` of --grpc-tls-cert's key")
	fs.StringVar(&o.grpcTLS.clientCA, "grpc-tls-client-ca", "", "require gRPC clients' certificates, verified by the CAs in this PEM `file` (mutual TLS)")
	fs.StringVar(&o.failMode, "fail-mode", defaultFailMode, "what a domain without fail_mode answers when Redis cannot decide: open, closed, local or error (see docs/server.md)")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "the fail policy's `deadline` of a decision on Redis")
	fs.IntVar(&o.replicas, "replicas", 1, "how many sluice-server processes share the Redis buckets: in the local fail mode each decides in 1/`N` of each limit")
	fs.BoolVar(&o.shadow, "shadow-mode", false, "answer every request OK, whatever its descriptors get (each still reports its own code)")
	fs.BoolVar(&o.quota, "quota-mode", false, "treat every limit as a quota_mode one: a request is refused only when every limit it matched is over")
	fs.BoolVar(&o.metadata, "response-dynamic-metadata", false, "fill in the response's dynamic_metadata: the domain, the descriptors, hits_addend and the metadata of the limits that passed")
	fs.StringVar(&headers, "response-headers", "ietf", "rate-limit `fields` the response asks Envoy to add: ietf (RateLimit-Policy, RateLimit), x (X-RateLimit-*), both or none")
	fs.StringVar(&o.postgres, "postgres", "", "the PostgreSQL `URL` of the plan store, for limits with plan: true")
	fs.IntVar(&o.maxKeys, "max-keys", 0, "the most buckets the memory store keeps (`N`; default: the memory backend's)")
	fs.StringVar(&o.logFormat, "log", "text", "log `format`: text or json")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: sluice-server [--config PATH] [--redis ADDR | --cluster ADDRS | --sentinel ADDRS --master NAME] [flags]\n\n"+
			"Serves Envoy's rate limit service (envoy.service.ratelimit.v3) on sluice's\n"+
			"algorithms, with buckets in memory unless a Redis deployment is named.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected argument %q: sluice-server takes only flags", fs.Arg(0))
	}
	for _, a := range []struct{ name, addr string }{{"--grpc", o.grpcAddr}, {"--http", o.httpAddr}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return options{}, fmt.Errorf("%s %q: %w", a.name, a.addr, err)
		}
	}
	if err := o.grpcTLS.check(); err != nil {
		return options{}, err
	}
	if useTLS || tlsOpts != (redisconn.TLS{}) {
		o.redis.TLS = &tlsOpts
	}
	if err := o.parseRedis(redisAddr, cluster, sentinel); err != nil {
		return options{}, err
	}
	if !slices.Contains(rlsconfig.FailModes, o.failMode) {
		return options{}, fmt.Errorf("--fail-mode %q: want one of %s", o.failMode, strings.Join(rlsconfig.FailModes, ", "))
	}
	if o.timeout <= 0 {
		return options{}, fmt.Errorf("--timeout %v: must be > 0", o.timeout)
	}
	if o.replicas < 1 || o.replicas > 1000 {
		return options{}, fmt.Errorf("--replicas %d: want 1 to 1000", o.replicas)
	}
	h, ok := headerChoices[headers]
	if !ok {
		return options{}, fmt.Errorf("--response-headers %q: want ietf, x, both or none", headers)
	}
	o.headers = h
	if o.maxKeys < 0 {
		return options{}, fmt.Errorf("--max-keys %d: must be >= 0", o.maxKeys)
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return options{}, fmt.Errorf("--log %q: want text or json", o.logFormat)
	}
	return o, nil
}

// parseRedis sets o.redis from the deployment flags: at most one of
// --redis, --cluster and --sentinel, --master with --sentinel only, and a
// known --client.
func (o *options) parseRedis(redisAddr, cluster, sentinel string) error {
	given := 0
	for _, v := range []string{redisAddr, cluster, sentinel} {
		if v != "" {
			given++
		}
	}
	switch {
	case given > 1:
		return errors.New("--redis, --cluster and --sentinel: give one at most")
	case sentinel != "" && o.redis.Sentinel == "":
		return errors.New("--sentinel needs --master")
	case sentinel == "" && o.redis.Sentinel != "":
		return errors.New("--master needs --sentinel")
	case !slices.Contains([]string{"go-redis", "rueidis"}, o.client):
		return fmt.Errorf("--client %q: want go-redis or rueidis", o.client)
	}
	var flagName, list string
	switch {
	case redisAddr != "":
		flagName, list = "--redis", redisAddr
	case cluster != "":
		flagName, list = "--cluster", cluster
		o.redis.Cluster = true
	case sentinel != "":
		flagName, list = "--sentinel", sentinel
	default:
		if o.redis.TLS != nil {
			return errors.New("--tls flags need --redis, --cluster or --sentinel")
		}
		return nil
	}
	for _, addr := range strings.Split(list, ",") {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%s %q: %w", flagName, addr, err)
		}
		o.redis.Addrs = append(o.redis.Addrs, addr)
	}
	if flagName == "--redis" && len(o.redis.Addrs) > 1 {
		return errors.New("--redis takes one address: for a cluster's seeds use --cluster")
	}
	return nil
}
