package rueidisbackend_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/redis/rueidis"

	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/test/redistest"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// A limiter whose decisions give up after 5ms, on a client that finds a
// stalled connection within a quarter of a second. The example needs a
// Redis server on 127.0.0.1:6379, so it is compiled but not run.
func ExampleLowLatency() {
	opt := rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}}
	rueidisbackend.LowLatency(&opt)
	client, err := rueidis.NewClient(opt)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	backend, err := rueidisbackend.New(client)
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(backend)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(100)}}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	d, err := limiter.Allow(ctx, "user:12345", cfg)
	if errors.Is(err, ratelimit.ErrTimeout) {
		log.Print("no decision within 5ms: the fail policy decides")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Allowed)
}

// TestLowLatency: LowLatency overwrites its fields, whatever the caller
// set, and leaves the others alone.
func TestLowLatency(t *testing.T) {
	t.Parallel()
	// fields are the settings LowLatency may touch, and some it must not.
	type fields struct {
		ConnWriteTimeout, KeepAlive, DialTimeout time.Duration
		SentinelDialTimeout, SentinelKeepAlive   time.Duration
		DisableRetry                             bool
		PipelineMultiplex                        int
		MasterSet                                string
	}
	get := func(o rueidis.ClientOption) fields {
		return fields{o.ConnWriteTimeout, o.Dialer.KeepAlive, o.Dialer.Timeout, o.Sentinel.Dialer.Timeout, o.Sentinel.Dialer.KeepAlive, o.DisableRetry, o.PipelineMultiplex, o.Sentinel.MasterSet}
	}
	const ms = time.Millisecond
	for _, tc := range []struct {
		name string
		opt  rueidis.ClientOption
		want fields
	}{
		{"zero", rueidis.ClientOption{}, fields{50 * ms, 100 * ms, 100 * ms, 100 * ms, 0, true, 0, ""}},
		{"set", rueidis.ClientOption{
			ConnWriteTimeout:  time.Minute,
			Dialer:            net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second},
			Sentinel:          rueidis.SentinelOption{Dialer: net.Dialer{Timeout: time.Second, KeepAlive: 5 * time.Second}, MasterSet: "m"},
			PipelineMultiplex: 3,
		}, fields{50 * ms, 100 * ms, 100 * ms, 100 * ms, 5 * time.Second, true, 3, "m"}},
	} {
		o := tc.opt
		rueidisbackend.LowLatency(&o)
		if got := get(o); got != tc.want {
			t.Errorf("LowLatency on %s options set\n%+v, want\n%+v", tc.name, got, tc.want)
		}
	}
}

// lowLatencyKinds are the clients the integration tests build. "Client"
// runs a lone call on its connection with a socket deadline; "Pipelined"
// always pipelines, with none.
var lowLatencyKinds = []redistest.LowLatencyKind{
	{Name: "Client", Topology: redistest.Standalone},
	{Name: "Pipelined", Topology: redistest.Standalone},
	{Name: "Sentinel", Topology: redistest.Sentinel},
	{Name: "Cluster", Topology: redistest.Cluster},
}

// lowLatencyBackend returns a backend on a new LowLatency client of kind,
// connected to s. The client is closed by t.Cleanup, before the servers
// are killed.
func lowLatencyBackend(t *testing.T, kind string, s redistest.Servers) ratelimit.Backend {
	t.Helper()
	opt := rueidis.ClientOption{InitAddress: s.Addrs, DisableCache: true}
	switch kind {
	case "Client", "Pipelined":
		opt.ForceSingleClient = true
		opt.AlwaysPipelining = kind == "Pipelined"
	case "Sentinel":
		opt.Sentinel.MasterSet = servers.SentinelMaster
	case "Cluster":
		t.Cleanup(waitDelayedRefresh) // runs after the client's Close
	default:
		t.Fatalf("unknown client kind %q", kind)
	}
	rueidisbackend.LowLatency(&opt)
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	b, err := rueidisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitDelayedRefresh waits, for up to 10s, until no goroutine of rueidis's
// delayed cluster refresh is left. A cluster client that lost a connection
// refreshes its slots after a random delay of up to a second, in a
// goroutine that outlives Close, which goleak would report. It returns as
// soon as the goroutine is gone; the bound leaves a loaded machine time.
func waitDelayedRefresh() {
	buf := make([]byte, 4<<20)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("rueidis.(*call).DelayDo")) {
			return
		}
	}
}

// stallBound is how long a call on a paused or dead server may take in
// these tests: far above the 5ms deadline and the 250ms it takes at most to
// find a stalled pipelining connection, and well below rueidis's defaults
// (up to 12s), so it still shows that no call waits for them. rueidis
// v1.0.79 can hold a call for a second past its deadline when the call
// opens a connection to a stalled server: the handshake fails, and
// pipe.Close may wait for its one-second escape timer (about 1 in 100
// decisions on a paused server, 1 in 20 under the race detector; see
// docs/operations.md). The bound leaves that second three more, for a
// loaded machine and the race detector.
const stallBound = 4 * time.Second

// TestLowLatencyIntegration runs [redistest.LowLatency] on each client
// kind. A call on a paused server returns ErrTimeout at about its 5ms
// deadline, or, without one, after about the 50ms ConnWriteTimeout on a
// connection serving it alone, and within 250ms on a pipelining one, when
// the PING finds the stall; not after rueidis's default of up to 12s. Once
// the server resumes it runs the call, which was sent once, so the bucket
// is charged once; and the next call succeeds, on a new connection if the
// old one was closed.
func TestLowLatencyIntegration(t *testing.T) {
	t.Parallel()
	redistest.LowLatency(t, redistest.LowLatencyAdapter{
		Kinds:        lowLatencyKinds,
		Backend:      lowLatencyBackend,
		StallBound:   stallBound,
		WantDeadline: "about the 5ms deadline, or a second more while connecting",
		WantBackstop: "at most 250ms, or a second more while connecting",
	})
}
