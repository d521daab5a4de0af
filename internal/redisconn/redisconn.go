// Package redisconn builds a go-redis or rueidis client for a Redis
// deployment (a standalone server, a Redis Cluster, or a master behind
// Sentinels) with the client settings sluice's Redis backends advise: no
// retries, since a command retried after a network error may have run
// and a retried decision is charged twice, and the context's deadline on
// the socket. It is one implementation for sluice's programs
// (cmd/sluice-server) and its test support (internal/test/harness, and
// through it cmd/sluice-verify and the test kit), so that what is checked
// is what runs.
package redisconn

import (
	"cmp"
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
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
)

// Server says where a Redis deployment is and how a client reaches it:
// the settings go-redis and rueidis both take. Its zero value but Addrs is
// a plain connection to a standalone server with the client settings
// sluice's docs recommend.
type Server struct {
	// Addrs is the standalone server's address, the cluster's nodes, or
	// the Sentinels.
	Addrs []string
	// Cluster says that Addrs are the nodes of a Redis Cluster.
	Cluster bool
	// Sentinel, if set, says that Addrs are Sentinels, which know the
	// master under this name.
	Sentinel string
	// DB is the database number SELECTed on a standalone or Sentinel
	// master (a cluster has only 0).
	DB int
	// Username and Password authenticate to the servers (AUTH); empty
	// means none.
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate to the
	// Sentinels.
	SentinelUsername, SentinelPassword string
	// TLS, if set, connects with TLS.
	TLS *TLS
	// Retries is how often a client may send a command again after a
	// network error: go-redis's MaxRetries, where 0 here is its -1 (none,
	// as the backend's docs advise) and go-redis's own default is 3; on
	// rueidis, more than 0 leaves DisableRetry off, as rueidis's default
	// does.
	Retries int
	// NoContextTimeout leaves go-redis's ContextTimeoutEnabled off, as its
	// default does, so that a call's deadline does not reach the socket.
	NoContextTimeout bool
	// LowLatency builds the client with the backend's LowLatency helper,
	// as docs/operations.md tells a user to, after the settings above.
	LowLatency bool
}

// TLS is the TLS setup of a [Server], as the client's tls.Config gets it.
type TLS struct {
	// CAFile is a PEM file of the certificates that verify the servers;
	// empty means the system's.
	CAFile string
	// CertFile and KeyFile are the PEM client certificate and key, for a
	// server that asks for one; both or neither.
	CertFile, KeyFile string
	// ServerName is the name to verify the servers' certificates against;
	// empty means the host of each address.
	ServerName string
	// InsecureSkipVerify accepts any certificate.
	InsecureSkipVerify bool
}

// GoRedis builds the go-redis client of s (a cluster, failover or plain
// client) with no retries and the context's deadline obeyed unless s says
// otherwise, as the Redis backends' docs recommend, and returns it with
// its settings in words: the ones that matter to a limiter, go-redis's
// defaults filled in, for a report or a log. It sends nothing. An error
// says why s cannot be built: no Addrs, both Cluster and Sentinel set, or
// a TLS setup that cannot be loaded.
func GoRedis(s Server) (redis.UniversalClient, []string, error) {
	tlsConfig, err := s.tlsConfig()
	if err != nil {
		return nil, nil, err
	}
	c, settings := goRedisClient(s, tlsConfig)
	return c, settings, nil
}

// Rueidis builds the rueidis client of s, with no retries unless s says
// otherwise, and returns it with its settings in words, as [GoRedis] does.
// rueidis dials at once: a dial refused on the network (a server started
// just before, or a machine too busy to answer in time) is tried again for
// a few seconds, and any other error is returned at once.
func Rueidis(s Server) (rueidis.Client, []string, error) {
	tlsConfig, err := s.tlsConfig()
	if err != nil {
		return nil, nil, err
	}
	opt, settings := rueidisOption(s, tlsConfig)
	c, err := newRueidis(opt)
	if err != nil {
		return nil, nil, err
	}
	return c, settings, nil
}

// tlsConfig returns the tls.Config of s, or nil for no TLS, or why no
// client of s can be built.
func (s Server) tlsConfig() (*tls.Config, error) {
	if len(s.Addrs) == 0 {
		return nil, errors.New("no Addrs")
	}
	if s.Cluster && s.Sentinel != "" {
		return nil, errors.New("both Cluster and Sentinel set")
	}
	return s.TLS.config()
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
