package testkit_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/testkit"
)

// checkoutLimit is the service's limit: 100 checkouts a customer an hour.
var checkoutLimit = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(100)}}

// newBackend builds the service's backend as its main does: its own
// go-redis client and options, sluice's backend under its prefix, and its
// layers.
func newBackend(_ context.Context, addrs []string) (ratelimit.Backend, func(), error) {
	client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs, MaxRetries: -1, ContextTimeoutEnabled: true})
	store, err := redisbackend.New(client, redisbackend.WithPrefix("checkout:"))
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	backend, err := ratelimit.Stack(store /* and the service's layers: telemetry, a fail policy, sharding */)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return backend, func() {
		backend.Close()
		client.Close()
	}, nil
}

// testLimitAcrossInstances is a test of the service: in its package it is
// TestLimitAcrossInstances (a file that is an example may hold no test).
func testLimitAcrossInstances(t *testing.T) {
	testkit.CheckInstances(t, testkit.InstanceCheck{
		// Only the test's own process starts the server: the instances,
		// which run the test again, get its address.
		Redis:   func(t testing.TB) []string { return []string{testkit.StartRedis(t).Addr()} },
		Backend: newBackend,
		Config:  checkoutLimit,
	})
}

// A service's test checks that its limiter, built as the service builds
// it, holds its limit exactly across instances: two processes of the test
// binary, each with 64 goroutines, make 5,000 calls on one bucket through
// backends of their own, and the test fails, with the report sluice-verify
// prints, if they were admitted more than the bucket allows, or fewer.
// The check must be made by a test function of the package, as
// testLimitAcrossInstances here: each instance is the test binary, run
// again with -test.run naming it.
func ExampleCheckInstances() {
	// In the service's package:
	//
	//	func TestLimitAcrossInstances(t *testing.T) { ... }
	//
	// with the body of testLimitAcrossInstances.
	_ = testLimitAcrossInstances
}
