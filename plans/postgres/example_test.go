package postgres_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/plans/postgres"
	"github.com/sluicehq/sluice/ratelimit"
)

// Example wires the store into a service: migrate at startup, put a cache
// in front of the store, keep the cache fresh with the change feed, and
// limit each request by its tenant's plan. It needs a server, so it only
// compiles here.
func Example() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// An admin tool would do this; here, one plan and one tenant on it.
	pro := plans.Plan{Name: "pro", Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(100).WithBurst(500)}}
	if _, err := store.PutPlan(ctx, pro); err != nil {
		log.Fatal(err)
	}
	if _, err := store.Assign(ctx, "tenant-42", "pro"); err != nil {
		log.Fatal(err)
	}

	cache, err := plans.NewCache(store)
	if err != nil {
		log.Fatal(err)
	}
	listening := make(chan error, 1)
	go func() {
		listening <- store.Listen(ctx, cache, postgres.WithListenHooks(postgres.ListenHooks{
			Disconnected: func(err error, retryIn time.Duration) {
				log.Printf("plans listener: %v; reconnecting in %v", err, retryIn)
			},
		}))
	}()
	defer func() { stop(); <-listening }()

	backend := memory.New() // or a Redis backend, shared by the replicas
	defer backend.Close()
	limiter := ratelimit.New(backend)
	d, err := cache.Bucket(limiter, "tenant-42:GET /search", "tenant-42").TryConsume(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("allowed: %v, remaining: %d", d.Allowed, d.Remaining)
}
