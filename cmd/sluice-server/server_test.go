package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlstest"
)

// TestMain runs the tests, failing them if one leaves a goroutine behind;
// or, in a process a test started with SLUICE_SERVER_ARGS set, is
// sluice-server with those arguments (separated by newlines).
func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv("SLUICE_SERVER_ARGS"); ok {
		os.Args = append([]string{"sluice-server"}, strings.Split(args, "\n")...)
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// testServer is a sluice-server the test started in its own process.
type testServer struct {
	grpc, http string
	client     rlspb.RateLimitServiceClient
	conn       *grpc.ClientConn
}

// start serves opts (its addresses are replaced by free loopback ones)
// until the test ends. reloaded hears each config reload.
func start(t *testing.T, opts options, reloaded func(error)) *testServer {
	t.Helper()
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, grpcLn, httpLn, opts, slog.New(slog.NewTextHandler(t.Output(), nil)), reloaded)
	}()
	s := &testServer{grpc: grpcLn.Addr().String(), http: httpLn.Addr().String()}
	s.dial(t)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s
}

// dial connects a gRPC client to the server, closed when the test ends.
func (s *testServer) dial(t *testing.T) {
	t.Helper()
	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	s.conn, s.client = conn, rlspb.NewRateLimitServiceClient(conn)
}

// defaults are the flags' defaults, as parseFlags gives them.
func defaults(t *testing.T, args ...string) options {
	t.Helper()
	o, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func ask(t *testing.T, c rlspb.RateLimitServiceClient, domain string, kv ...string) *rlspb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, rlstest.Request(domain, kv))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestExampleConfig serves the built-in example over gRPC: 60 a minute
// for an address, then OVER_LIMIT; health SERVING; /healthcheck and
// /metrics on HTTP.
func TestExampleConfig(t *testing.T) {
	s := start(t, defaults(t), nil)
	over := 0
	minute := time.Now().Unix() / 60
	for range 61 {
		if ask(t, s.client, "example", "remote_address", "10.0.0.7").OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
			over++
		}
	}
	// The window is the clock's minute: when one ended during the calls,
	// the next let some through again.
	if next := time.Now().Unix() / 60; over != 1 && !(next != minute && over == 0) {
		t.Errorf("61 calls on 60 a minute: %d over the limit, want 1", over)
	}
	h, err := healthpb.NewHealthClient(s.conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: ratelimitService})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v, %v", h, err)
	}
	if body := get(t, "http://"+s.http+"/healthcheck"); body != "OK\n" {
		t.Errorf("/healthcheck: %q", body)
	}
	metrics := get(t, "http://"+s.http+"/metrics")
	for _, want := range []string{
		`sluice_server_requests_total{code="OVER_LIMIT",domain="example"`,
		`key_class="example.remote_address"`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// TestGrpcurl calls the server with grpcurl, which finds the API by server
// reflection: a client not written here. It runs $SLUICE_GRPCURL (which
// make test sets), else grpcurl from PATH; without either the test skips,
// or under CI fails (make tools installs it).
func TestGrpcurl(t *testing.T) {
	bin := os.Getenv("SLUICE_GRPCURL")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("grpcurl"); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal("grpcurl is not on PATH: make tools installs it")
			}
			t.Skip("grpcurl is not on PATH: make tools installs it")
		}
	}
	s := start(t, defaults(t), nil)
	out, err := exec.Command(bin, "-plaintext", s.grpc, "list").CombinedOutput()
	if err != nil || !strings.Contains(string(out), ratelimitService) || !strings.Contains(string(out), "grpc.health.v1.Health") {
		t.Fatalf("grpcurl list: %v\n%s", err, out)
	}
	call := func() map[string]any {
		out, err := exec.Command(bin, "-plaintext", "-d",
			`{"domain":"example","descriptors":[{"entries":[{"key":"tenant","value":"acme"},{"key":"path","value":"/upload"}]}],"hitsAddend":60}`,
			s.grpc, ratelimitService+"/ShouldRateLimit").CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl: %v\n%s", err, out)
		}
		var resp map[string]any
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatalf("grpcurl's output %s: %v", out, err)
		}
		return resp
	}
	// 100 uploads a day, in the clock's days: 60, then 60 more.
	day := time.Now().Unix() / (24 * 3600)
	if r := call(); r["overallCode"] != "OK" {
		t.Errorf("60 of 100: %v", r)
	}
	if r := call(); r["overallCode"] != "OVER_LIMIT" && time.Now().Unix()/(24*3600) == day {
		t.Errorf("60 more: %v, want OVER_LIMIT", r)
	}
}

// TestReload changes the config file under a running server: a good file
// applies, a bad one is refused with its line and field and the one before
// keeps serving.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	write := func(data string) {
		t.Helper()
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil { // as deploys replace files
			t.Fatal(err)
		}
	}
	write("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	reloads := make(chan error, 16)
	s := start(t, defaults(t, "--config", path), func(err error) { reloads <- err })
	await := func() error {
		t.Helper()
		select {
		case err := <-reloads:
			return err
		case <-time.After(time.Minute):
			t.Fatal("no reload within a minute")
			return nil
		}
	}
	limit := func() uint32 {
		return ask(t, s.client, "d", "k", "v").Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limit(); got != 1 {
		t.Fatalf("limit %d, want 1", got)
	}
	// Calls go on throughout the reloads: none may fail.
	stop, failed := make(chan struct{}), make(chan error, 1)
	var calls sync.WaitGroup
	for range 4 {
		calls.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := s.client.ShouldRateLimit(context.Background(), rlstest.Request("d", []string{"k", "busy"}))
				if err != nil {
					select {
					case failed <- err:
					default:
					}
					return
				}
			}
		})
	}
	defer func() {
		close(stop)
		calls.Wait()
		select {
		case err := <-failed:
			t.Errorf("a call during the reloads failed: %v", err)
		default:
		}
	}()
	write("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n")
	for err := await(); err != nil || limit() != 7; err = await() {
		if err != nil {
			t.Fatalf("a good file refused: %v", err)
		}
	}
	write("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n")
	err := await()
	for err == nil { // a late reload of the good file
		err = await()
	}
	var want = "limits.yaml:4: descriptors[0].rate_limit.unit"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a bad file: got %v, want an error naming %s", err, want)
	}
	if got := limit(); got != 7 {
		t.Errorf("after a bad file: limit %d, want the old 7", got)
	}
}

// TestFlags checks that bad flags are refused naming the flag.
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--fail-mode", "sometimes"}, "--fail-mode"},
		{[]string{"--redis", "a:1", "--cluster", "b:2"}, "--redis, --cluster and --sentinel"},
		{[]string{"--sentinel", "a:1"}, "--sentinel needs --master"},
		{[]string{"--redis", "nowhere"}, "--redis"},
		{[]string{"--client", "jedis"}, "--client"},
		{[]string{"--response-headers", "all"}, "--response-headers"},
		{[]string{"--replicas", "0"}, "--replicas"},
		{[]string{"--timeout", "0s"}, "--timeout"},
		{[]string{"--tls"}, "--tls"},
		{[]string{"--grpc", "8081"}, "--grpc"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		if _, err := parseFlags(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error naming %s", c.args, err, c.want)
		}
	}
	if _, err := parseFlags([]string{"--config", "/nonexistent/limits.yaml"}, io.Discard); err != nil {
		t.Errorf("--config is read at start, not parsed: %v", err)
	}
	err := run(t.Context(), defaults(t, "--config", "/nonexistent/limits.yaml", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"), slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--config") {
		t.Errorf("a missing config: got %v, want an error naming --config", err)
	}
}

// replica is a sluice-server process the test started: this test binary,
// which TestMain turns into the server.
func replica(t *testing.T, args ...string) *testServer {
	t.Helper()
	ports := freePorts(t, 2)
	s := &testServer{grpc: ports[0], http: ports[1]}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SLUICE_SERVER_ARGS="+strings.Join(append(args, "--grpc", s.grpc, "--http", s.http), "\n"))
	cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("replica %s: %v", s.grpc, err)
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + s.http + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not healthy within a minute: %v", s.grpc, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.dial(t)
	return s
}

// freePorts returns n loopback addresses whose ports were free a moment
// ago.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	return addrs
}

// exactly runs calls calls from goroutines goroutines spread over the
// servers' clients, each of one hit on domain's descriptor, and returns
// how many were OK.
func exactly(t *testing.T, servers []*testServer, goroutines, calls int, domain string, kv ...string) int {
	t.Helper()
	var (
		mu     sync.Mutex
		passed int
		errs   []error
		wg     sync.WaitGroup
		next   = make(chan int, calls)
	)
	for i := range calls {
		next <- i
	}
	close(next)
	req := rlstest.Request(domain, kv)
	for g := range goroutines {
		wg.Go(func() {
			c := servers[g%len(servers)].client
			for range next {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := c.ShouldRateLimit(ctx, req)
				cancel()
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case resp.OverallCode == rlspb.RateLimitResponse_OK:
					passed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%d calls failed: %v", len(errs), err)
	}
	return passed
}
