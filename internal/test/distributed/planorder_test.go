package distributed_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/plans/postgres"
	"github.com/sluicehq/sluice/ratelimit"
)

// editCalls is how many calls the commit-order test alternates between its
// two replicas.
const editCalls = 1000

// TestPlanEditCommitOrderIntegration is issue 28's reproduction, on real
// Postgres and real Redis. A transaction raises pro from 100 to 200 a
// minute and stays open; meanwhile Assign moves c1 from free to pro. One
// replica reads c1 while the edit is still open, the other after both have
// committed; then they alternate 1,000 calls on c1's bucket under Additive,
// on a frozen clock.
//
// When versions follow statement order, Assign commits at once with a
// version above the edit's, and both replicas hold c1 at that one version:
// one with 100, the other with 200. Each call then converts the bucket
// from the other's config and gains the difference, and every call passes.
// With versions in commit order, the replicas hold different versions, or
// the same config: the bucket converts once, forward, and admits at most
// what pro allows.
//
// Whether Assign waits for the edit is up to the store; the test waits for
// either, at a barrier: Assign has returned, or the database shows it
// waiting for a lock.
func TestPlanEditCommitOrderIntegration(t *testing.T) {
	skipShort(t)
	db := servers.Postgres(t)
	store, pool := planStore(t, db)
	ctx := context.Background()
	const subject = "c1"
	if _, err := store.Assign(ctx, subject, "free"); err != nil {
		t.Fatal(err)
	}
	const raised = 200
	bandwidths, err := plans.MarshalBandwidths([]ratelimit.Bandwidth{ratelimit.PerMinute(raised).WithID("minute")})
	if err != nil {
		t.Fatal(err)
	}

	edit, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edit.Rollback(ctx) }) // after the commit, a no-op
	if _, err := edit.Exec(ctx, "UPDATE sluice.plans SET bandwidths = $1 WHERE name = 'pro'", bandwidths); err != nil {
		t.Fatal(err)
	}
	assigned := make(chan error, 1)
	go func() {
		_, err := store.Assign(ctx, subject, "pro")
		assigned <- err
	}()
	returned := servers.ReturnedOrWaiting(t, pool, assigned)
	t.Logf("while the edit is open, Assign has returned: %v (else it waits for a lock)", returned)

	early := replica(t, db)
	earlyCfg, err := early.Config(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := edit.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-assigned; err != nil {
		t.Fatalf("Assign: %v", err)
	}
	late := replica(t, db)
	lateCfg, err := late.Config(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replica read while the edit was open: capacity %d at version %d; after both commits: capacity %d at version %d",
		earlyCfg.Bandwidths[0].Capacity, earlyCfg.Version, lateCfg.Bandwidths[0].Capacity, lateCfg.Version)
	if lateCfg.Bandwidths[0].Capacity != raised {
		t.Fatalf("after both commits: capacity %d, want pro's %d", lateCfg.Bandwidths[0].Capacity, raised)
	}
	if earlyCfg.Version == lateCfg.Version && earlyCfg.Bandwidths[0].Capacity != lateCfg.Bandwidths[0].Capacity {
		t.Errorf("two replicas hold different configs at version %d: capacity %d and %d",
			lateCfg.Version, earlyCfg.Bandwidths[0].Capacity, lateCfg.Bandwidths[0].Capacity)
	}

	srv := servers.StartRedis(t)
	gr := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { gr.Close() })
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	b1, err := redisbackend.New(gr, redisbackend.WithClock(frozen{}))
	if err != nil {
		t.Fatal(err)
	}
	b2, err := rueidisbackend.New(rc, rueidisbackend.WithClock(frozen{}))
	if err != nil {
		t.Fatal(err)
	}
	buckets := []*ratelimit.Bucket{
		early.Bucket(ratelimit.New(b1, ratelimit.WithInheritance(ratelimit.Additive)), subject, subject),
		late.Bucket(ratelimit.New(b2, ratelimit.WithInheritance(ratelimit.Additive)), subject, subject),
	}
	admitted := 0
	for i := range editCalls {
		d, err := buckets[i%2].TryConsume(ctx, 1)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if d.Allowed {
			admitted++
		}
	}
	t.Logf("%d of %d alternating calls admitted", admitted, editCalls)
	if admitted < 1 || admitted > raised {
		t.Errorf("%d of %d alternating calls admitted, want 1 to %d: pro allows %d", admitted, editCalls, raised, raised)
	}
}

// replica is a service replica's plan cache: a store over a pool of its
// own, a TTL long enough that it keeps what it read for the test, and a
// read wait long enough that its first lookup gets what the store holds,
// not the default plan, however slow a loaded machine is to answer (the
// default waits 50ms).
func replica(t *testing.T, db *servers.PGDatabase) *plans.Cache {
	t.Helper()
	s, err := postgres.New(db.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := plans.NewCache(s, plans.WithTTL(time.Hour), plans.WithReadWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
