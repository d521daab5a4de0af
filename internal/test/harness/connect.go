package harness

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/backend/redischeck"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/ratelimit"
)

// Conn is a backend of a [Spec] on a client of its own, as an instance
// makes its calls through it.
type Conn struct {
	// Backend makes the decisions.
	Backend ratelimit.Backend
	// Settings describe the client as it was built, in words: the
	// settings that matter to a limiter, for a report.
	Settings []string
	// Redis is the go-redis client of BackendGoRedis and BackendRacy;
	// nil for BackendRueidis.
	Redis redis.UniversalClient

	ping  func(ctx context.Context) error
	check func(ctx context.Context) (redischeck.Report, error)
	close func()
}

// Ping makes one round trip to the server; on a Conn of [NewConn] without
// a ping, it returns an error.
func (c *Conn) Ping(ctx context.Context) error {
	if c.ping == nil {
		return errors.New("harness: the Conn has no ping")
	}
	return c.ping(ctx)
}

// Check is the backend's Check: the servers the client reaches, and every
// setting of theirs or of the client that can break the limits. The racy
// backend has none, and reports no server.
func (c *Conn) Check(ctx context.Context) (redischeck.Report, error) {
	if c.check == nil {
		return redischeck.Report{}, nil
	}
	return c.check(ctx)
}

// Close closes the client.
func (c *Conn) Close() { c.close() }

// NewConn is a Conn of backend b, which its caller built: ping makes one
// round trip through it (an instance makes one before it says it is
// ready; nil will do for a Conn that only observes a run), and close, if
// not nil, releases it. It has no Settings and no
// Check; its Redis is nil unless the caller sets it, as it must for a
// [Run].Observer.
func NewConn(b ratelimit.Backend, ping func(ctx context.Context) error, close func()) *Conn {
	if close == nil {
		close = func() {}
	}
	return &Conn{Backend: b, ping: ping, close: close}
}

// Connect builds spec's backend on a new client of spec.Server: with no
// retries and the context's deadline obeyed unless the Server says
// otherwise, as the Redis backends' docs recommend. It sends nothing. It
// is the [Connector] of sluice's own backends.
func Connect(spec Spec) (*Conn, error) {
	if len(spec.Addrs) == 0 {
		return nil, errors.New("spec: no Addrs")
	}
	if spec.Cluster && spec.Sentinel != "" {
		return nil, errors.New("spec: Cluster and Sentinel both set")
	}
	tlsConfig, err := spec.TLS.config()
	if err != nil {
		return nil, err
	}
	switch spec.Backend {
	case BackendGoRedis, BackendRacy:
		c, settings := goRedisClient(spec.Server, tlsConfig)
		conn := &Conn{
			Settings: settings,
			Redis:    c,
			ping:     func(ctx context.Context) error { return c.Ping(ctx).Err() },
			close:    func() { _ = c.Close() },
		}
		if spec.Backend == BackendRacy {
			conn.Backend = Racy{Client: c, Prefix: spec.Prefix}
			conn.Settings = append(conn.Settings, "racy: GET, decide in Go, SET (not atomic: tests only)")
			return conn, nil
		}
		b, err := redisbackend.New(c, redisbackend.WithPrefix(spec.Prefix))
		if err != nil {
			conn.close()
			return nil, err
		}
		conn.Backend, conn.check = b, b.Check
		return conn, nil
	case BackendRueidis:
		opt, settings := rueidisOption(spec.Server, tlsConfig)
		c, err := newRueidis(opt)
		if err != nil {
			return nil, err
		}
		b, err := rueidisbackend.New(c, rueidisbackend.WithPrefix(spec.Prefix))
		if err != nil {
			c.Close()
			return nil, err
		}
		return &Conn{
			Backend:  b,
			Settings: settings,
			ping:     func(ctx context.Context) error { return c.Do(ctx, c.B().Ping().Build()).Error() },
			check:    b.Check,
			close:    c.Close,
		}, nil
	}
	return nil, fmt.Errorf("spec: Backend %q is not %q, %q or %q", spec.Backend, BackendGoRedis, BackendRueidis, BackendRacy)
}

// NewGoRedis returns a go-redis client of s, built as [Connect] builds the
// one of BackendGoRedis.
func NewGoRedis(s Server) (redis.UniversalClient, error) {
	tlsConfig, err := s.TLS.config()
	if err != nil {
		return nil, err
	}
	c, _ := goRedisClient(s, tlsConfig)
	return c, nil
}

// goRedisClient builds the go-redis client of s: a cluster, failover or
// plain client, and its settings in words.
func goRedisClient(s Server, tlsConfig *tls.Config) (redis.UniversalClient, []string) {
	u := &redis.UniversalOptions{
		Addrs:                 s.Addrs,
		IsClusterMode:         s.Cluster,
		MasterName:            s.Sentinel,
		DB:                    s.DB,
		Username:              s.Username,
		Password:              s.Password,
		SentinelUsername:      s.SentinelUsername,
		SentinelPassword:      s.SentinelPassword,
		TLSConfig:             tlsConfig,
		MaxRetries:            s.Retries,
		ContextTimeoutEnabled: !s.NoContextTimeout,
	}
	if s.Retries == 0 {
		u.MaxRetries = -1
	}
	switch {
	case s.Cluster:
		o := u.Cluster()
		if s.LowLatency {
			redisbackend.LowLatencyCluster(o)
		}
		c := redis.NewClusterClient(o)
		o = c.Options() // with go-redis's defaults filled in, as below
		return c, []string{fmt.Sprintf("go-redis cluster client: MaxRetries %d, ContextTimeoutEnabled %t, PoolSize %d, DialTimeout %v, ReadTimeout %v, WriteTimeout %v, MaxRedirects %d",
			o.MaxRetries, o.ContextTimeoutEnabled, o.PoolSize, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRedirects)}
	case s.Sentinel != "":
		o := u.Failover()
		if s.LowLatency {
			redisbackend.LowLatencyFailover(o)
		}
		return clientSettings("failover client", redis.NewFailoverClient(o))
	default:
		o := u.Simple()
		if s.LowLatency {
			redisbackend.LowLatency(o)
		}
		return clientSettings("client", redis.NewClient(o))
	}
}

// clientSettings returns c, and its settings in words.
func clientSettings(kind string, c *redis.Client) (redis.UniversalClient, []string) {
	o := c.Options()
	return c, []string{fmt.Sprintf("go-redis %s: MaxRetries %d, ContextTimeoutEnabled %t, PoolSize %d, DialTimeout %v, ReadTimeout %v, WriteTimeout %v",
		kind, o.MaxRetries, o.ContextTimeoutEnabled, o.PoolSize, o.DialTimeout, o.ReadTimeout, o.WriteTimeout)}
}

// rueidisOption is the rueidis ClientOption of s, and its settings in
// words.
func rueidisOption(s Server, tlsConfig *tls.Config) (rueidis.ClientOption, []string) {
	opt := rueidis.ClientOption{
		InitAddress:  s.Addrs,
		SelectDB:     s.DB,
		Username:     s.Username,
		Password:     s.Password,
		TLSConfig:    tlsConfig,
		DisableRetry: s.Retries == 0,
		// A decision is never cached; a client of its own needs no
		// tracking.
		DisableCache: true,
		// A standalone server is one client, even when the server is
		// a cluster node that would redirect; a cluster is found by
		// asking.
		ForceSingleClient: !s.Cluster && s.Sentinel == "",
	}
	if s.Sentinel != "" {
		opt.Sentinel = rueidis.SentinelOption{
			MasterSet: s.Sentinel,
			Username:  s.SentinelUsername,
			Password:  s.SentinelPassword,
			TLSConfig: tlsConfig,
		}
	}
	if s.LowLatency {
		rueidisbackend.LowLatency(&opt)
	}
	kind := "client"
	switch {
	case s.Cluster:
		kind = "cluster client"
	case s.Sentinel != "":
		kind = "Sentinel client"
	}
	// The timeouts as rueidis.NewClient fills them in when they are 0.
	dial := cmp.Or(opt.Dialer.Timeout, rueidis.DefaultDialTimeout)
	keepAlive := cmp.Or(opt.Dialer.KeepAlive, rueidis.DefaultTCPKeepAlive)
	write := cmp.Or(opt.ConnWriteTimeout, 10*max(rueidis.DefaultTCPKeepAlive, keepAlive))
	return opt, []string{fmt.Sprintf("rueidis %s: DisableRetry %t, ConnWriteTimeout %v, Dialer.Timeout %v, Dialer.KeepAlive %v",
		kind, opt.DisableRetry, write, dial, keepAlive)}
}

// config builds the tls.Config of t, or nil if t is nil.
func (t *TLS) config() (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	c := &tls.Config{ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS CAFile: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CAFile %s: no PEM certificate in it", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("TLS CertFile and KeyFile: give both or neither")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("TLS CertFile and KeyFile: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// dialPatience is how long newRueidis tries to dial.
const dialPatience = 5 * time.Second

// newRueidis is rueidis.NewClient, which dials at once: it tries again
// every 10ms for up to dialPatience while the dial fails on the network
// (a server started just before, or a machine too busy to answer in
// time), and returns any other error at once.
func newRueidis(opt rueidis.ClientOption) (rueidis.Client, error) {
	start := time.Now()
	for {
		c, err := rueidis.NewClient(opt)
		var netErr *net.OpError
		if err == nil || !errors.As(err, &netErr) || time.Since(start) >= dialPatience {
			return c, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
