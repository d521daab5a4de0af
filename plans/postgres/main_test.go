package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait for something a test expects to happen;
// only a wait that never ends fails, so it is generous.
const waitTimeout = 10 * time.Second

// newStore returns a store, migrated, on a new database of the test's own,
// and the pool it uses.
func newStore(t testing.TB, opts ...Option) (*Store, *pgxpool.Pool) {
	t.Helper()
	pool := servers.Postgres(t).Pool(t)
	return migrated(t, pool, opts...), pool
}

// migrated returns a store over pool whose schema Migrate has created.
func migrated(t testing.TB, pool *pgxpool.Pool, opts ...Option) *Store {
	t.Helper()
	s, err := New(pool, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// execSQL runs a statement as a DBA would, failing the test on error.
func execSQL(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// queryInt returns the one integer sql selects.
func queryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// proPlan is a valid plan with every kind of bandwidth field set.
func proPlan() plans.Plan {
	return plans.Plan{
		Name:      "pro",
		Algorithm: ratelimit.TokenBucket,
		Bandwidths: []ratelimit.Bandwidth{
			ratelimit.PerMinute(100).WithID("burst").WithInitialTokens(50),
			ratelimit.Every(time.Hour, 1000).WithID("hourly").AlignedTo(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)),
		},
	}
}

// putPlan stores p, failing the test on error.
func putPlan(t testing.TB, s *Store, p plans.Plan) plans.Plan {
	t.Helper()
	got, err := s.PutPlan(context.Background(), p)
	if err != nil {
		t.Fatalf("PutPlan(%s): %v", p.Name, err)
	}
	return got
}

// assign puts subject on plan, failing the test on error.
func assign(t testing.TB, s *Store, subject, plan string) uint64 {
	t.Helper()
	v, err := s.Assign(context.Background(), subject, plan)
	if err != nil {
		t.Fatalf("Assign(%s, %s): %v", subject, plan, err)
	}
	return v
}

// lookup looks subject up, failing the test on error.
func lookup(t testing.TB, s *Store, subject string) plans.Assignment {
	t.Helper()
	a, err := s.Lookup(context.Background(), subject)
	if err != nil {
		t.Fatalf("Lookup(%s): %v", subject, err)
	}
	return a
}
