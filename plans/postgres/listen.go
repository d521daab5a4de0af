package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/sluicehq/sluice/plans"
)

// Defaults of [Store.Listen], each changed by the option of the same name.
const (
	// DefaultHeartbeat is how long a connection may be quiet before the
	// listener checks it with a SELECT 1: a connection whose server or
	// network went away without a word (half-open) looks quiet too, and
	// would otherwise go unnoticed until the kernel gives up on it.
	DefaultHeartbeat = 10 * time.Second
	// DefaultTimeout bounds each of the listener's own round trips:
	// connecting and LISTEN, and the heartbeat's SELECT 1.
	DefaultTimeout = 5 * time.Second
	// DefaultMinBackoff is the wait before the first attempt to reconnect;
	// it doubles with each failed attempt up to DefaultMaxBackoff, and each
	// wait is drawn at random from its upper half, so that replicas that
	// lost the same server do not reconnect in step.
	DefaultMinBackoff = 100 * time.Millisecond
	// DefaultMaxBackoff is the longest wait between attempts to reconnect.
	DefaultMaxBackoff = 5 * time.Second
	// DefaultApplicationName is the application_name of the listener's
	// connection, as pg_stat_activity shows it.
	DefaultApplicationName = "sluice-plans-listener"
)

// ListenOption configures [Store.Listen].
type ListenOption func(*listenConfig)

type listenConfig struct {
	heartbeat, timeout     time.Duration
	minBackoff, maxBackoff time.Duration
	appName                string
	hooks                  ListenHooks
}

// WithHeartbeat sets how long a connection may be quiet before the
// listener checks it, more than 0; the default is [DefaultHeartbeat].
func WithHeartbeat(d time.Duration) ListenOption { return func(c *listenConfig) { c.heartbeat = d } }

// WithTimeout bounds connecting, LISTEN and each heartbeat, more than 0;
// the default is [DefaultTimeout].
func WithTimeout(d time.Duration) ListenOption { return func(c *listenConfig) { c.timeout = d } }

// WithBackoff sets the waits between attempts to reconnect: from minWait,
// doubling up to maxWait, with 0 < minWait <= maxWait. The defaults are
// [DefaultMinBackoff] and [DefaultMaxBackoff].
func WithBackoff(minWait, maxWait time.Duration) ListenOption {
	return func(c *listenConfig) { c.minBackoff, c.maxBackoff = minWait, maxWait }
}

// WithApplicationName sets the application_name of the listener's
// connection, which must not be empty; the default is
// [DefaultApplicationName].
func WithApplicationName(name string) ListenOption { return func(c *listenConfig) { c.appName = name } }

// WithListenHooks sets the functions called as the listener connects,
// loses its connection and meets a payload it cannot read.
func WithListenHooks(h ListenHooks) ListenOption { return func(c *listenConfig) { c.hooks = h } }

// ListenHooks are called by [Store.Listen], for logs and metrics. Every
// field may be nil. They are called synchronously on Listen's goroutine,
// so they must return promptly; notifications wait meanwhile.
type ListenHooks struct {
	// Connected is called each time the listener is listening on a new
	// connection, just before it calls the Invalidator's Resync.
	Connected func()
	// Disconnected is called when the connection fails, or an attempt to
	// make one fails, with why; the listener tries again after retryIn.
	Disconnected func(err error, retryIn time.Duration)
	// BadPayload is called for a notification on the channel whose payload
	// is not a change the triggers write (say, a hand-written NOTIFY); the
	// listener otherwise ignores it.
	BadPayload func(payload string, err error)
}

func newListenConfig(opts []ListenOption) (listenConfig, error) {
	c := listenConfig{
		heartbeat:  DefaultHeartbeat,
		timeout:    DefaultTimeout,
		minBackoff: DefaultMinBackoff,
		maxBackoff: DefaultMaxBackoff,
		appName:    DefaultApplicationName,
	}
	for _, opt := range opts {
		opt(&c)
	}
	switch {
	case c.heartbeat <= 0:
		return listenConfig{}, fmt.Errorf("postgres: WithHeartbeat(%v): must be > 0", c.heartbeat)
	case c.timeout <= 0:
		return listenConfig{}, fmt.Errorf("postgres: WithTimeout(%v): must be > 0", c.timeout)
	case c.minBackoff <= 0 || c.maxBackoff < c.minBackoff:
		return listenConfig{}, fmt.Errorf("postgres: WithBackoff(%v, %v): want 0 < min <= max", c.minBackoff, c.maxBackoff)
	case c.appName == "":
		return listenConfig{}, errors.New("postgres: WithApplicationName(\"\"): must not be empty")
	}
	return c, nil
}

// Listen tells inv about every change to the store's plans and
// assignments until ctx ends, and then returns ctx's error. Run it on a
// goroutine of its own; it starts none. A nil inv or a bad option is an
// error at once.
//
// It listens on a connection of its own, made from the pool's config
// (with [WithApplicationName]'s application_name), not on one of the
// pool's, which a LISTEN would hold for good. For each notification it
// calls inv.Invalidate; a payload it cannot read goes to
// [ListenHooks].BadPayload and is ignored. A connection quiet for
// [WithHeartbeat]'s interval is checked with a SELECT 1. When the
// connection fails, Listen closes it and reconnects, waiting as
// [WithBackoff] says between attempts, for as long as ctx lasts. After
// each connect, the first included, it calls inv.Resync: notifications
// sent while it was not listening are lost, and entries cached before it
// started may be stale.
func (s *Store) Listen(ctx context.Context, inv plans.Invalidator, opts ...ListenOption) error {
	if inv == nil {
		return errors.New("postgres: Listen: nil Invalidator")
	}
	c, err := newListenConfig(opts)
	if err != nil {
		return err
	}
	l := &listener{store: s, inv: inv, cfg: c}
	return l.run(ctx)
}

// listener is one run of Listen.
type listener struct {
	store *Store
	inv   plans.Invalidator
	cfg   listenConfig
}

// run listens, and reconnects after each failure, until ctx ends.
func (l *listener) run(ctx context.Context) error {
	backoff := l.cfg.minBackoff
	for {
		connected, err := l.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if connected {
			backoff = l.cfg.minBackoff
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if h := l.cfg.hooks.Disconnected; h != nil {
			h(err, wait)
		}
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
		backoff = min(2*backoff, l.cfg.maxBackoff)
	}
}

// sleep waits for d, or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// session connects, resyncs and passes notifications on until the
// connection fails or ctx ends. It reports whether it got as far as
// listening, and why it ended.
func (l *listener) session(ctx context.Context) (connected bool, err error) {
	conn, err := l.connect(ctx)
	if err != nil {
		return false, err
	}
	defer l.close(conn)
	if h := l.cfg.hooks.Connected; h != nil {
		h()
	}
	l.inv.Resync()
	return true, l.serve(ctx, conn)
}

// connect makes the listener's connection and listens on the channel.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg := l.store.pool.Config().ConnConfig // Config returns a deep copy
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = l.cfg.appName
	// A timed-out wait must leave the connection usable and must not
	// cancel the heartbeat that follows it, as the cancel request that a
	// pool's config may ask for can: it arrives late, at whatever the
	// server runs next. A deadline on the socket does neither.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: listener: connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.store.cfg.channel}.Sanitize()); err != nil {
		l.close(conn)
		return nil, fmt.Errorf("postgres: listener: LISTEN %s: %w", l.store.cfg.channel, err)
	}
	return conn, nil
}

// close ends the connection, within the listener's timeout: a server that
// went away does not answer.
func (l *listener) close(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.timeout)
	defer cancel()
	_ = conn.Close(ctx) // the connection is dropped either way
}

// serve passes notifications on, and checks the connection whenever it
// has been quiet for a heartbeat, until it fails or ctx ends.
func (l *listener) serve(ctx context.Context, conn *pgx.Conn) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, l.cfg.heartbeat)
		n, err := conn.WaitForNotification(waitCtx)
		quiet := waitCtx.Err() != nil
		cancel()
		if n != nil {
			l.deliver(n.Payload)
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case quiet && pgconn.Timeout(err):
			if err := l.heartbeat(ctx, conn); err != nil {
				return err
			}
		default:
			return fmt.Errorf("postgres: listener: wait for notifications: %w", err)
		}
	}
}

// heartbeat checks that the server still answers on conn.
func (l *listener) heartbeat(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.timeout)
	defer cancel()
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		return fmt.Errorf("postgres: listener: heartbeat: %w", err)
	}
	return nil
}

// deliver passes one payload on to the Invalidator, or to BadPayload.
func (l *listener) deliver(payload string) {
	c, err := parsePayload(payload)
	if err != nil {
		if h := l.cfg.hooks.BadPayload; h != nil {
			h(payload, err)
		}
		return
	}
	l.inv.Invalidate(c)
}
