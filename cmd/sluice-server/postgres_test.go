package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlstest"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/plans/postgres"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestPlansFromPostgres serves a plan limit from a PostgreSQL plan store:
// a tenant's descriptor is limited by its plan, and moving it to another
// plan applies without a restart (LISTEN/NOTIFY), to the bucket it has
// (with sluice's default inheritance, AsIs, its tokens stay as they were:
// none left, until the new plan's refill brings more).
func TestPlansFromPostgres(t *testing.T) {
	db := servers.Postgres(t)
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, db.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	perDay := func(n int64) []ratelimit.Bandwidth { return []ratelimit.Bandwidth{ratelimit.Every(24*time.Hour, n)} }
	for _, p := range []plans.Plan{
		{Name: "free", Algorithm: ratelimit.TokenBucket, Bandwidths: perDay(2)},
		{Name: "pro", Algorithm: ratelimit.TokenBucket, Bandwidths: perDay(50)},
	} {
		if _, err := store.PutPlan(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Assign(ctx, "acme", "free"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "plans.yaml")
	config := "domain: p\ndescriptors:\n  - key: tenant\n    rate_limit: {plan: true}\n"
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	s := start(t, defaults(t, "--config", path, "--postgres", db.ConnString()), nil)
	// A plan the store is slow to read (the first, on a loaded machine) is
	// decided on the default plan meanwhile (plans.DefaultReadWait): look,
	// taking nothing, until the server has read acme's.
	planOf := func() uint32 {
		req := rlstest.Request("p", []string{"tenant", "acme"})
		req.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
		resp, err := s.client.ShouldRateLimit(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	for deadline := time.Now().Add(time.Minute); planOf() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("acme's plan not read within a minute")
		}
	}

	var codes []string
	for range 3 {
		resp := ask(t, s.client, "p", "tenant", "acme")
		codes = append(codes, resp.OverallCode.String())
		if lim := resp.Statuses[0].CurrentLimit; lim.GetRequestsPerUnit() != 2 {
			t.Errorf("free plan: current limit %v, want 2 a day", lim)
		}
	}
	if codes[0] != "OK" || codes[1] != "OK" || codes[2] != "OVER_LIMIT" {
		t.Errorf("free plan, 3 calls: %v, want OK, OK, OVER_LIMIT", codes)
	}

	if _, err := store.Assign(ctx, "acme", "pro"); err != nil {
		t.Fatal(err)
	}
	// The change reaches the server's cache by notification: wait for it.
	deadline := time.Now().Add(time.Minute)
	for {
		resp := ask(t, s.client, "p", "tenant", "acme")
		if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 50 {
			if resp.OverallCode.String() != "OVER_LIMIT" {
				t.Errorf("pro plan, the bucket's tokens as they were (none): %v, want OVER_LIMIT", resp)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the move to pro did not apply within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
