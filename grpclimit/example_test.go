package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/ratelimit"
)

// A server whose calls are limited to a burst of 2 per method and peer,
// and 4 in flight: the third call in a row is refused with
// ResourceExhausted and a RetryInfo, and every call gets the draft-10
// RateLimit fields as header metadata. (The server listens on bufconn, in
// memory; a real one listens on a net.Listener.)
func Example() {
	store := memory.New()
	defer store.Close()
	lim, err := grpclimit.New(ratelimit.New(store),
		grpclimit.WithConfig(ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(2).WithID("per-minute")}}),
		grpclimit.WithConcurrency(ratelimit.InFlight(4, 30*time.Second)))
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for range 3 {
		var header metadata.MD
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		fmt.Println(status.Code(err), header.Get("ratelimit"))
		if err != nil {
			fmt.Println("retry in", retryDelay(err).Round(time.Second))
		}
	}
	// Output:
	// OK ["per-minute";r=1;t=30]
	// OK ["per-minute";r=0;t=30]
	// ResourceExhausted ["per-minute";r=0;t=30]
	// retry in 30s
}

// At most one call in flight per peer: while the first runs, a second is
// refused, with a RetryInfo of the time until the first's permit's lease
// ends. When the first has ended, its permit is back.
func ExampleInterceptors_UnaryServerInterceptor() {
	lim, err := grpclimit.New(ratelimit.New(memory.New(memory.WithSweepInterval(0))),
		grpclimit.WithConcurrency(ratelimit.InFlight(1, 2*time.Second)))
	if err != nil {
		panic(err)
	}
	intercept := lim.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.Reports/Build"}
	var handler grpc.UnaryHandler
	handler = func(ctx context.Context, req any) (any, error) {
		// While this call runs, a second one from the same peer is refused.
		_, err := intercept(ctx, req, info, handler)
		fmt.Println("beside it:", status.Code(err), retryDelay(err).Round(time.Second))
		return "done", nil
	}
	resp, err := intercept(context.Background(), nil, info, handler)
	fmt.Println("first:", resp, status.Code(err) == codes.OK)
	// Output:
	// beside it: ResourceExhausted 2s
	// first: done true
}
