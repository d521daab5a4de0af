package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	watchMethod = "/grpc.health.v1.Health/Watch"
	// The PeerKey of each method's calls over bufconn, whose address is
	// "bufconn".
	checkKey = "grpc:" + checkMethod + ":bufconn"
	watchKey = "grpc:" + watchMethod + ":bufconn"
)

// healthService is the service under test: Check and Watch run what they are
// told, and by default answer at once.
type healthService struct {
	healthpb.UnimplementedHealthServer
	check func(ctx context.Context) error
	watch func(stream grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error
}

func (h *healthService) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if h.check != nil {
		if err := h.check(ctx); err != nil {
			return nil, err
		}
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *healthService) Watch(_ *healthpb.HealthCheckRequest, stream grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	if h.watch != nil {
		return h.watch(stream)
	}
	return stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// start serves h on bufconn behind the interceptors of in, after outer
// ones (a recovery interceptor), and returns a client of it. The server
// and the connection end with the test.
func start(t *testing.T, in *grpclimit.Interceptors, h *healthService, outer ...grpc.ServerOption) healthpb.HealthClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	opts := append(outer, grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(in.StreamServerInterceptor()))
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, h)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		<-served
	})
	return healthpb.NewHealthClient(conn)
}

func mustNew(t *testing.T, l *ratelimit.Limiter, opts ...grpclimit.Option) *grpclimit.Interceptors {
	t.Helper()
	in, err := grpclimit.New(l, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return in
}

// retryDelay is the RetryInfo of err's status, or -1 without one.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return -1
}

// permitSpy is the memory backend, recording the permit calls it is asked,
// and telling each renewal on renewed.
type permitSpy struct {
	*memory.Backend
	clock   ratelimit.Clock
	mu      sync.Mutex
	ops     map[ratelimit.PermitOp]int
	renewed chan time.Time // the store's time of each granted renewal, if not nil
}

func newPermitSpy(clock ratelimit.Clock) *permitSpy {
	opts := []memory.Option{memory.WithSweepInterval(0)}
	if clock != nil {
		opts = append(opts, memory.WithClock(clock))
	}
	return &permitSpy{Backend: memory.New(opts...), clock: clock, ops: map[ratelimit.PermitOp]int{}}
}

func (s *permitSpy) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	s.mu.Lock()
	s.ops[req.Op]++
	renewed := s.renewed
	s.mu.Unlock()
	var at time.Time
	if s.clock != nil {
		at = s.clock.Now()
	}
	d, err := s.Backend.DoPermit(ctx, key, lim, req)
	if req.Op == ratelimit.PermitRenew && d.Granted && renewed != nil {
		select {
		case renewed <- at:
		default:
		}
	}
	return d, err
}

func (s *permitSpy) count(op ratelimit.PermitOp) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ops[op]
}

func inFlight(t *testing.T, b ratelimit.PermitBackend, key string, lim ratelimit.Concurrency) int64 {
	t.Helper()
	d, err := b.DoPermit(context.Background(), key, lim, ratelimit.PermitRequest{Op: ratelimit.PermitInspect})
	if err != nil {
		t.Fatalf("inspect %q: %v", key, err)
	}
	return d.InFlight
}

var perMinute = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(2).WithID("per-minute")}}

func newClock() *ratelimittest.Clock {
	return ratelimittest.NewClock(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
}

// TestRate checks the rate limit on unary calls and streams: the third of a
// burst of two is refused with ResourceExhausted and a RetryInfo of the
// exact wait, and every decision sends the draft-10 fields as header
// metadata.
func TestRate(t *testing.T) {
	in := mustNew(t, ratelimit.New(newPermitSpy(newClock())), grpclimit.WithConfig(perMinute))
	client := start(t, in, &healthService{})
	ctx := t.Context()
	type result struct {
		err    error
		header metadata.MD
	}
	for _, tc := range []struct {
		name string
		call func() result
	}{
		{"unary", func() result {
			var md metadata.MD
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
			return result{err, md}
		}},
		{"stream", func() result {
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				return result{err: err}
			}
			_, err = stream.Recv()
			md, _ := stream.Header()
			return result{err, md}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, want := range []struct {
				code      codes.Code
				rateLimit string
				retry     time.Duration
			}{
				{codes.OK, `"per-minute";r=1;t=30`, -1},
				{codes.OK, `"per-minute";r=0;t=30`, -1},
				{codes.ResourceExhausted, `"per-minute";r=0;t=30`, 30 * time.Second},
			} {
				got := tc.call()
				if status.Code(got.err) != want.code || retryDelay(got.err) != want.retry {
					t.Errorf("call %d: %v, RetryInfo %v; want %v, %v", i+1, got.err, retryDelay(got.err), want.code, want.retry)
				}
				if fmt.Sprint(got.header.Get("ratelimit")) != "["+want.rateLimit+"]" ||
					fmt.Sprint(got.header.Get("ratelimit-policy")) != `["per-minute";q=2;w=60]` {
					t.Errorf("call %d: header %v", i+1, got.header)
				}
				if ra := got.header.Get("retry-after"); (want.code == codes.OK) != (len(ra) == 0) || len(ra) > 0 && ra[0] != "30" {
					t.Errorf("call %d: retry-after %v", i+1, ra)
				}
			}
		})
	}
}

// blocking says when a call starts and ends it when told.
type blocking struct {
	entered chan struct{}
	release chan struct{}
}

func newBlocking() *blocking {
	return &blocking{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (b *blocking) health() *healthService {
	return &healthService{
		check: func(context.Context) error { b.entered <- struct{}{}; <-b.release; return nil },
		watch: func(grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
			b.entered <- struct{}{}
			<-b.release
			return nil
		},
	}
}

// TestConcurrencyExact makes m calls at once to handlers that block until
// told: exactly n run, and the rest are refused at once with the
// configured code and a RetryInfo; when the n end, their permits are
// back. Unary calls and streams alike.
func TestConcurrencyExact(t *testing.T) {
	const n, m = 3, 10
	lim := ratelimit.InFlight(n, time.Minute)
	for _, tc := range []struct {
		name   string
		stream bool
		opts   []grpclimit.Option
		code   codes.Code
		key    string
	}{
		{"unary", false, nil, codes.ResourceExhausted, checkKey},
		{"stream", true, nil, codes.ResourceExhausted, watchKey},
		{"unary shared Unavailable", false, []grpclimit.Option{
			grpclimit.WithConcurrencyCode(codes.Unavailable),
			grpclimit.WithConcurrencyKey(func(context.Context, string) (string, error) { return "fleet", nil }),
		}, codes.Unavailable, "fleet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newPermitSpy(nil)
			b := newBlocking()
			client := start(t, mustNew(t, ratelimit.New(store), append([]grpclimit.Option{grpclimit.WithConcurrency(lim)}, tc.opts...)...), b.health())
			call := func() error {
				if !tc.stream {
					_, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{})
					return err
				}
				stream, err := client.Watch(t.Context(), &healthpb.HealthCheckRequest{})
				if err != nil {
					return err
				}
				if _, err = stream.Recv(); err == io.EOF {
					return nil
				}
				return err
			}
			results := make(chan error, m)
			for range m {
				go func() { results <- call() }()
			}
			// Every call either enters its handler or is answered without
			// it; the ones that enter stay there.
			entered, refused := 0, 0
			for entered+refused < m {
				select {
				case <-b.entered:
					entered++
				case err := <-results:
					refused++
					if status.Code(err) != tc.code || retryDelay(err) != grpclimit.MaxConcurrencyRetryAfter {
						t.Errorf("refused: %v, RetryInfo %v; want %v and %v (a minute's lease, capped)", err, retryDelay(err), tc.code, grpclimit.MaxConcurrencyRetryAfter)
					}
				}
			}
			if entered != n {
				t.Fatalf("%d handlers ran at once, want %d", entered, n)
			}
			close(b.release)
			for range n {
				if err := <-results; err != nil {
					t.Errorf("admitted: %v", err)
				}
			}
			if got := inFlight(t, store, tc.key, lim); got != 0 {
				t.Errorf("%d permits held after every call ended", got)
			}
			if got := store.count(ratelimit.PermitRelease); got != n {
				t.Errorf("%d releases, want %d", got, n)
			}
		})
	}
}

// recoverer is what an application's recovery interceptor does: gRPC
// itself does not recover a handler's panic, which would end the process.
// It records what it recovered.
type recoverer struct {
	mu        sync.Mutex
	recovered []any
}

func (r *recoverer) record(v any) error {
	r.mu.Lock()
	r.recovered = append(r.recovered, v)
	r.mu.Unlock()
	return status.Errorf(codes.Internal, "panic: %v", v)
}

func (r *recoverer) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer func() {
				if v := recover(); v != nil {
					err = r.record(v)
				}
			}()
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
			defer func() {
				if v := recover(); v != nil {
					err = r.record(v)
				}
			}()
			return h(srv, ss)
		}),
	}
}

// TestRelease checks that a call's permit goes back however its handler
// ends: it returns, fails, or panics (the panic going on up to a recovery
// interceptor outside).
func TestRelease(t *testing.T) {
	lim := ratelimit.InFlight(1, time.Minute)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		h       *healthService
		code    codes.Code
		panicky bool
	}{
		{"return", &healthService{}, codes.OK, false},
		{"error", &healthService{
			check: func(context.Context) error { return status.Error(codes.NotFound, "no such service") },
			watch: func(grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
				return status.Error(codes.NotFound, "no such service")
			},
		}, codes.NotFound, false},
		{"panic", &healthService{
			check: func(context.Context) error { panic(boom) },
			watch: func(grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error { panic(boom) },
		}, codes.Internal, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newPermitSpy(nil)
			rec := &recoverer{}
			client := start(t, mustNew(t, ratelimit.New(store), grpclimit.WithConcurrency(lim)), tc.h, rec.options()...)
			for i := range 2 { // the second of each would be refused if the first kept its permit
				_, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{})
				if status.Code(err) != tc.code {
					t.Errorf("unary %d: %v, want %v", i+1, err, tc.code)
				}
				if got := inFlight(t, store, checkKey, lim); got != 0 {
					t.Errorf("unary %d: %d permits held after it ended", i+1, got)
				}
				stream, err := client.Watch(t.Context(), &healthpb.HealthCheckRequest{})
				if err != nil {
					t.Fatal(err)
				}
				for err == nil {
					_, err = stream.Recv()
				}
				if err == io.EOF {
					err = nil
				}
				if status.Code(err) != tc.code {
					t.Errorf("stream %d: %v, want %v", i+1, err, tc.code)
				}
				if got := inFlight(t, store, watchKey, lim); got != 0 {
					t.Errorf("stream %d: %d permits held after it ended", i+1, got)
				}
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if tc.panicky && (len(rec.recovered) != 4 || rec.recovered[0] != boom) {
				t.Errorf("recovered %v, want the handlers' 4 panics", rec.recovered)
			}
			if got := store.count(ratelimit.PermitRelease); got != 4 {
				t.Errorf("%d releases, want 4", got)
			}
		})
	}
}

// TestKeepAlive holds a stream open past its permit's lease, on the
// store's clock, which the test moves: the permit is renewed while the
// stream runs, so that it is still held, and another stream refused, after
// the lease it was acquired with has ended. When the stream ends, its
// permit is released and no renewal is left running (goleak).
func TestKeepAlive(t *testing.T) {
	const lease = 30 * time.Millisecond // renewals every 10 ms of real time; leases end on the store's clock
	lim := ratelimit.InFlight(1, lease)
	clock := newClock()
	store := newPermitSpy(clock)
	b := newBlocking()
	client := start(t, mustNew(t, ratelimit.New(store), grpclimit.WithConcurrency(lim)), b.health())

	stream, err := client.Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { _, err := stream.Recv(); ended <- err }()
	<-b.entered
	acquired := clock.Now()

	store.mu.Lock()
	store.renewed = make(chan time.Time, 1)
	store.mu.Unlock()
	clock.Advance(lease / 2)
	// A renewal at the store's time, after the clock moved. (The timeout
	// only ends a test that would otherwise wait for ever: renewals come
	// every 10 ms.)
	for renewed := false; !renewed; {
		select {
		case at := <-store.renewed:
			renewed = !at.Before(acquired.Add(lease / 2))
		case <-time.After(time.Minute):
			t.Fatal("no renewal in a minute")
		}
	}
	clock.Advance(lease/2 + time.Microsecond) // past the first lease's end, within the renewed one's
	if got := inFlight(t, store, watchKey, lim); got != 1 {
		t.Fatalf("%d permits held after the lease it was acquired with ended, want the renewed 1", got)
	}
	other, err := client.Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a stream beside the long one: %v, want ResourceExhausted", err)
	}

	close(b.release)
	if err := <-ended; err != io.EOF {
		t.Errorf("long stream ended with %v, want io.EOF", err)
	}
	if got := inFlight(t, store, watchKey, lim); got != 0 {
		t.Errorf("%d permits held after the stream ended", got)
	}
}

// TestRateBeforeConcurrency checks that a call the rate limit refuses
// takes no permit.
func TestRateBeforeConcurrency(t *testing.T) {
	store := newPermitSpy(newClock())
	in := mustNew(t, ratelimit.New(store), grpclimit.WithConfig(perMinute), grpclimit.WithConcurrency(ratelimit.InFlight(1, time.Minute)))
	client := start(t, in, &healthService{})
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		if _, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{}); status.Code(err) != want {
			t.Errorf("call %d: %v, want %v", i+1, err, want)
		}
	}
	if got := store.count(ratelimit.PermitAcquire); got != 2 {
		t.Errorf("%d acquires, want 2: none for the call the rate limit refused", got)
	}
}

// TestKeys checks WithKey: a key from the call's metadata, and the codes of
// a key function's errors.
func TestKeys(t *testing.T) {
	store := newPermitSpy(newClock())
	byTenant := func(ctx context.Context, method string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		switch v := md.Get("tenant"); {
		case len(v) == 0:
			return "", status.Error(codes.Unauthenticated, "no tenant")
		case v[0] == "broken":
			return "", errors.New("tenant directory down")
		default:
			return "tenant:" + v[0] + ":" + method, nil
		}
	}
	client := start(t, mustNew(t, ratelimit.New(store), grpclimit.WithKey(byTenant), grpclimit.WithConfig(perMinute)), &healthService{})
	call := func(tenant string) error {
		ctx := t.Context()
		if tenant != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "tenant", tenant)
		}
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	for i, tc := range []struct {
		tenant string
		want   codes.Code
	}{
		{"a", codes.OK}, {"a", codes.OK}, {"a", codes.ResourceExhausted},
		{"b", codes.OK}, // a bucket of its own
		{"", codes.Unauthenticated}, {"broken", codes.Internal},
	} {
		if err := call(tc.tenant); status.Code(err) != tc.want {
			t.Errorf("call %d (tenant %q): %v, want %v", i+1, tc.tenant, err, tc.want)
		}
	}
	d, err := store.Do(t.Context(), "tenant:b:"+checkMethod, perMinute, ratelimit.Request{Op: ratelimit.Inspect})
	if err != nil || d.Remaining != 1 {
		t.Errorf("tenant b's bucket: %+v, %v; want 1 left", d, err)
	}
}

// failingStore is a store that is down, for rates and permits alike.
type failingStore struct{}

func (failingStore) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	return ratelimit.Decision{}, fmt.Errorf("%w: connection refused", ratelimit.ErrBackendUnavailable)
}

func (failingStore) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	return ratelimit.PermitDecision{}, fmt.Errorf("%w: connection refused", ratelimit.ErrBackendUnavailable)
}

// ratesOnly is a Backend that holds no permits.
type ratesOnly struct{ ratelimit.Backend }

// degraded answers every call as a fail policy that decided without the
// store; with shareFull, it refuses permits as failpolicy's Local mode
// does when its share is full: on its own count.
type degraded struct{ allow, shareFull bool }

func (g degraded) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{Allowed: g.allow, Degraded: true, RetryAfter: 2 * time.Second}, nil
}

func (g degraded) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if g.shareFull {
		return ratelimit.PermitDecision{Degraded: true, Limit: lim.Limit, InFlight: lim.Limit, RetryAfter: 3 * time.Second}, nil
	}
	return ratelimit.PermitDecision{Granted: g.allow, Degraded: true, Limit: lim.Limit}, nil
}

// TestFailures checks the answers when the limiter cannot decide, closed
// by default and open by option, and that a misused limiter is never let
// through.
func TestFailures(t *testing.T) {
	rate := grpclimit.WithConfig(perMinute)
	conc := grpclimit.WithConcurrency(ratelimit.InFlight(1, time.Minute))
	for _, tc := range []struct {
		name  string
		b     ratelimit.Backend
		opts  []grpclimit.Option
		code  codes.Code
		retry time.Duration
	}{
		{"rate store down", failingStore{}, []grpclimit.Option{rate}, codes.Unavailable, time.Second},
		{"permit store down", failingStore{}, []grpclimit.Option{conc}, codes.Unavailable, time.Second},
		{"rate store down, open", failingStore{}, []grpclimit.Option{rate, grpclimit.WithFailOpen()}, codes.OK, -1},
		{"both down, open", failingStore{}, []grpclimit.Option{rate, conc, grpclimit.WithFailOpen()}, codes.OK, -1},
		{"config func down", newPermitSpy(nil), []grpclimit.Option{grpclimit.WithConfigFunc(func(context.Context, string) (ratelimit.Config, error) {
			return ratelimit.Config{}, errors.New("plans store down")
		})}, codes.Unavailable, time.Second},
		{"fail policy closed, rate", degraded{}, []grpclimit.Option{rate}, codes.Unavailable, 2 * time.Second},
		{"fail policy closed, permits", degraded{}, []grpclimit.Option{conc}, codes.Unavailable, time.Second},
		// The Local mode's own share being full is the caller's: as the
		// store's refusal.
		{"fail policy local, share full", degraded{shareFull: true}, []grpclimit.Option{conc}, codes.ResourceExhausted, 3 * time.Second},
		{"fail policy open", degraded{allow: true}, []grpclimit.Option{rate, conc}, codes.OK, -1},
		{"no permits", ratesOnly{newPermitSpy(nil)}, []grpclimit.Option{conc, grpclimit.WithFailOpen()}, codes.Internal, -1},
		{"invalid limit", newPermitSpy(nil), []grpclimit.Option{grpclimit.WithFailOpen(), grpclimit.WithConcurrencyFunc(func(context.Context, string) (ratelimit.Concurrency, error) {
			return ratelimit.InFlight(0, time.Second), nil
		})}, codes.Internal, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := start(t, mustNew(t, ratelimit.New(tc.b), tc.opts...), &healthService{})
			_, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{})
			if status.Code(err) != tc.code || retryDelay(err) != tc.retry {
				t.Errorf("%v, RetryInfo %v; want %v, %v", err, retryDelay(err), tc.code, tc.retry)
			}
		})
	}
}

// TestCallerGone checks that a call whose context has ended gets its
// context's code, not a store failure, and never reaches the handler.
func TestCallerGone(t *testing.T) {
	in := mustNew(t, ratelimit.New(newPermitSpy(nil)), grpclimit.WithConfig(perMinute), grpclimit.WithConcurrency(ratelimit.InFlight(1, time.Minute)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	_, err := in.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, func(context.Context, any) (any, error) {
		called = true
		return nil, nil
	})
	if status.Code(err) != codes.Canceled || called {
		t.Errorf("%v, handler called %v; want Canceled and no call", err, called)
	}
}

// TestHeadersOption checks WithHeaders: the de facto trio besides, or none.
func TestHeadersOption(t *testing.T) {
	for _, tc := range []struct {
		h    httplimit.Headers
		want []string
	}{
		{httplimit.DefaultHeaders, []string{"ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}},
		{0, nil},
	} {
		client := start(t, mustNew(t, ratelimit.New(newPermitSpy(newClock())), grpclimit.WithConfig(perMinute), grpclimit.WithHeaders(tc.h)), &healthService{})
		var md metadata.MD
		if _, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.Header(&md)); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, name := range []string{"ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"} {
			if len(md.Get(name)) > 0 {
				got = append(got, name)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("WithHeaders(%d): fields %v, want %v", tc.h, got, tc.want)
		}
	}
}

func TestPeerKey(t *testing.T) {
	key, err := grpclimit.PeerKey(context.Background(), checkMethod)
	if err != nil || key != "grpc:"+checkMethod+":unknown" {
		t.Errorf("no peer: %q, %v", key, err)
	}
	long := "/" + strings.Repeat("x", ratelimit.MaxKeyLen)
	key, err = grpclimit.PeerKey(context.Background(), long)
	if err != nil || len(key) > ratelimit.MaxKeyLen || !strings.HasPrefix(key, "grpc:~") {
		t.Errorf("long method: %q, %v", key, err)
	}
}

func TestNewErrors(t *testing.T) {
	l := ratelimit.New(newPermitSpy(nil))
	rate := grpclimit.WithConfig(perMinute)
	conc := grpclimit.WithConcurrency(ratelimit.InFlight(1, time.Second))
	key := func(context.Context, string) (string, error) { return "k", nil }
	for _, tc := range []struct {
		name string
		l    *ratelimit.Limiter
		opts []grpclimit.Option
		want string
	}{
		{"nil limiter", nil, []grpclimit.Option{rate}, "grpclimit: New: nil limiter"},
		{"no limit", l, nil, "grpclimit: New: no limit: pass WithConfig, WithConfigFunc, WithConcurrency or WithConcurrencyFunc"},
		{"nil option", l, []grpclimit.Option{rate, nil}, "grpclimit: New: nil option"},
		{"bad config", l, []grpclimit.Option{grpclimit.WithConfig(ratelimit.Config{})}, "grpclimit: WithConfig: ratelimit: invalid config"},
		{"two configs", l, []grpclimit.Option{rate, grpclimit.WithConfigFunc(func(context.Context, string) (ratelimit.Config, error) { return perMinute, nil })},
			"grpclimit: WithConfigFunc: the config is already given by WithConfig"},
		{"nil config func", l, []grpclimit.Option{grpclimit.WithConfigFunc(nil)}, "grpclimit: WithConfigFunc: nil function"},
		{"bad limit", l, []grpclimit.Option{grpclimit.WithConcurrency(ratelimit.InFlight(1, 0))}, "grpclimit: WithConcurrency: ratelimit: invalid config: Concurrency.Lease"},
		{"two limits", l, []grpclimit.Option{conc, grpclimit.WithConcurrencyFunc(func(context.Context, string) (ratelimit.Concurrency, error) {
			return ratelimit.Concurrency{}, nil
		})}, "grpclimit: WithConcurrencyFunc: the concurrency limit is already given by WithConcurrency"},
		{"nil limit func", l, []grpclimit.Option{grpclimit.WithConcurrencyFunc(nil)}, "grpclimit: WithConcurrencyFunc: nil function"},
		{"nil key", l, []grpclimit.Option{rate, grpclimit.WithKey(nil)}, "grpclimit: WithKey: nil function"},
		{"two keys", l, []grpclimit.Option{rate, grpclimit.WithKey(key), grpclimit.WithKey(key)}, "grpclimit: WithKey: the key is already given by WithKey"},
		{"nil concurrency key", l, []grpclimit.Option{conc, grpclimit.WithConcurrencyKey(nil)}, "grpclimit: WithConcurrencyKey: nil function"},
		{"code", l, []grpclimit.Option{conc, grpclimit.WithConcurrencyCode(codes.Aborted)},
			"grpclimit: WithConcurrencyCode: code must be ResourceExhausted or Unavailable, got Aborted"},
		{"code without limit", l, []grpclimit.Option{rate, grpclimit.WithConcurrencyCode(codes.Unavailable)},
			"grpclimit: New: WithConcurrencyKey and WithConcurrencyCode need WithConcurrency or WithConcurrencyFunc"},
		{"key without limit", l, []grpclimit.Option{rate, grpclimit.WithConcurrencyKey(key)},
			"grpclimit: New: WithConcurrencyKey and WithConcurrencyCode need WithConcurrency or WithConcurrencyFunc"},
		{"headers", l, []grpclimit.Option{rate, grpclimit.WithHeaders(8)}, "grpclimit: WithHeaders: unknown headers 0x8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := grpclimit.New(tc.l, tc.opts...)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || in != nil {
				t.Errorf("New: %v, %v; want an error starting %q and no interceptors", in != nil, err, tc.want)
			}
		})
	}
}
