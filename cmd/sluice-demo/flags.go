package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// defaultListen is where the demo serves unless --listen says otherwise.
const defaultListen = ":8080"

// options are the demo's settings, as its flags give them.
type options struct {
	// listen is the TCP address the server listens on.
	listen string
	// redisAddrs are the Redis server's address, or with cluster the
	// cluster's seed addresses; none for the in-memory backend.
	redisAddrs []string
	// cluster makes redisAddrs the seeds of a Redis Cluster.
	cluster bool
	// replicas is how many demo processes share the Redis buckets, so
	// that while Redis is away each decides in its share of each limit
	// (failpolicy.WithInstances); at least 1, and only 1 without Redis.
	replicas int
}

// maxReplicas is the most --replicas takes: far beyond any demo, and small
// enough that a typo (an extra digit or two) is an error, not a share of
// 1 token for every limit.
const maxReplicas = 1000

// parseFlags reads the command line (without the program name). Usage and
// flag syntax errors go to output; the error returned names the flag at
// fault.
func parseFlags(args []string, output io.Writer) (options, error) {
	fs := flag.NewFlagSet("sluice-demo", flag.ContinueOnError)
	fs.SetOutput(output)
	listen := fs.String("listen", defaultListen, "serve the demo at this `address` (host:port; an empty host listens on every interface)")
	redisAddr := fs.String("redis", "", "keep buckets in the Redis server at this `address` (host:port) instead of in memory")
	cluster := fs.Bool("cluster", false, "treat --redis as a comma-separated list of Redis Cluster seed addresses")
	replicas := fs.String("replicas", "1", "how many demo processes share the --redis buckets (`N`, 1 to 1000): while Redis is away each decides in 1/N of each limit")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: sluice-demo [--listen ADDR] [--redis ADDR [--cluster] [--replicas N]]\n\n"+
			"Serves a web page that shows sluice rate limiting plans of a free tenant,\n"+
			"a pro tenant and anonymous callers. Buckets live in memory unless --redis\n"+
			"names a Redis server (or, with --cluster, a Redis Cluster's seeds).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected argument %q: sluice-demo takes only flags", fs.Arg(0))
	}
	opts := options{listen: *listen, cluster: *cluster}
	if err := checkHostPort(opts.listen); err != nil {
		return options{}, fmt.Errorf("--listen %q: %w", opts.listen, err)
	}
	addrs, err := redisAddrs(*redisAddr, *cluster)
	if err != nil {
		return options{}, err
	}
	opts.redisAddrs = addrs
	if opts.replicas, err = parseReplicas(*replicas, len(addrs) > 0); err != nil {
		return options{}, err
	}
	return opts, nil
}

// parseReplicas validates --replicas: a whole number from 1 to
// maxReplicas, and more than 1 only with Redis, as in-memory buckets are
// not shared.
func parseReplicas(value string, redis bool) (int, error) {
	n, err := strconv.Atoi(value)
	switch {
	case err != nil:
		return 0, fmt.Errorf("--replicas %q: not a whole number", value)
	case n < 1 || n > maxReplicas:
		return 0, fmt.Errorf("--replicas %d: want 1 to %d", n, maxReplicas)
	case n > 1 && !redis:
		return 0, fmt.Errorf("--replicas %d needs --redis: replicas share limits only through Redis; in memory each process has its own", n)
	}
	return n, nil
}

// redisAddrs validates --redis and --cluster together.
func redisAddrs(value string, cluster bool) ([]string, error) {
	if value == "" {
		if cluster {
			return nil, errors.New("--cluster needs --redis: give the cluster's seed addresses with --redis host:port,host:port")
		}
		return nil, nil
	}
	addrs := []string{value}
	if cluster {
		addrs = strings.Split(value, ",")
	} else if strings.Contains(value, ",") {
		return nil, fmt.Errorf("--redis %q: a list of addresses needs --cluster", value)
	}
	for i, addr := range addrs {
		addr = strings.TrimSpace(addr)
		if err := checkHostPort(addr); err != nil {
			return nil, fmt.Errorf("--redis %q: address %d %q: %w", value, i+1, addr, err)
		}
		if host, _, _ := net.SplitHostPort(addr); host == "" {
			return nil, fmt.Errorf("--redis %q: address %d %q: missing host", value, i+1, addr)
		}
		addrs[i] = addr
	}
	return addrs, nil
}

// checkHostPort reports whether addr is host:port with a port from 0 to
// 65535 (0 picks a free port).
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want host:port, as in localhost:8080 or :8080")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}
