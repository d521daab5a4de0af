package testkit_test

import (
	"context"
	"flag"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/testkit"
)

// testLimitOnRedis is a service's test: its limiter, on a Redis of the
// test's own, admits 3 of 5 calls.
func testLimitOnRedis(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: testkit.StartRedis(t).Addr()})
	t.Cleanup(func() { client.Close() })
	backend, err := redisbackend.New(client)
	if err != nil {
		t.Fatal(err)
	}
	limiter := ratelimit.New(backend)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3)}}
	admitted := 0
	for range 5 {
		d, err := limiter.Allow(context.Background(), "customer:42", cfg)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("admitted %d of 5; want 3", admitted)
	}
}

// A test of a service gets a Redis of its own with one call; this example
// runs such a test as go test would.
func ExampleStartRedis() {
	fmt.Println("passed:", run(testLimitOnRedis))
	// Output: passed: true
}

// run runs test as go test runs a test, but without -v's lines, which
// would be the example's output, and reports whether it passed (a skip
// passes); a failure prints its log.
func run(test func(*testing.T)) bool {
	v := flag.Lookup("test.v")
	was := v.Value.String()
	_ = v.Value.Set("false")
	defer func() { _ = v.Value.Set(was) }()
	return testing.RunTests(func(string, string) (bool, error) { return true, nil },
		[]testing.InternalTest{{Name: "TestLimitOnRedis", F: test}})
}
