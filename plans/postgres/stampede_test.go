package postgres

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/plans"
)

// TestColdStampede sends 1,000 goroutines at once to a plan cache in front
// of the store, all for one subject it has never seen, and counts the
// lookups the server ran with pg_stat_statements: exactly one.
func TestColdStampede(t *testing.T) {
	server := servers.StartPostgres(t)
	pool := server.NewDatabase(t).Pool(t)
	ctx := context.Background()
	execSQL(t, pool, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	s := migrated(t, pool)
	putPlan(t, s, proPlan())
	assign(t, s, "cold", "pro")
	// Every caller waits for the one read, however slowly a busy machine
	// runs it: the count is the point, not the read wait.
	cache, err := plans.NewCache(s, plans.WithReadWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	const lookups = `SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE '%FROM "sluice".assignments a%'`
	execSQL(t, pool, "SELECT pg_stat_statements_reset()")

	const callers = 1000
	var start, done sync.WaitGroup
	start.Add(1)
	errs := make(chan error, callers)
	for range callers {
		done.Go(func() {
			start.Wait()
			cfg, err := cache.Config(ctx, "cold")
			if err == nil && cfg.Bandwidths[0].Capacity != proPlan().Bandwidths[0].Capacity {
				t.Errorf("Config = %+v, want pro's", cfg)
			}
			errs <- err
		})
	}
	start.Done()
	done.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := queryInt(t, pool, lookups)
	t.Logf("%d goroutines on one cold subject: %d lookup queries at the server (pg_stat_statements)", callers, got)
	if got != 1 {
		t.Errorf("the server ran %d lookups, want 1", got)
	}
}
