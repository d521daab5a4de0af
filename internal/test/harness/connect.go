package harness

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/backend/redischeck"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/redisconn"
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

// Connect builds spec's backend on a new client of spec.Server, as
// [redisconn] builds it: with no retries and the context's deadline
// obeyed unless the Server says otherwise, as the Redis backends' docs
// recommend. It sends nothing. It is the [Connector] of sluice's own
// backends.
func Connect(spec Spec) (*Conn, error) {
	switch spec.Backend {
	case BackendGoRedis, BackendRacy:
		c, settings, err := redisconn.GoRedis(spec.Server.Server)
		if err != nil {
			return nil, err
		}
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
		c, settings, err := redisconn.Rueidis(spec.Server.Server)
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
// one of BackendGoRedis ([redisconn.GoRedis], without its settings).
func NewGoRedis(s Server) (redis.UniversalClient, error) {
	c, _, err := redisconn.GoRedis(s.Server)
	return c, err
}
