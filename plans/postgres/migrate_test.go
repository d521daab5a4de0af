package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/test/servers"
)

func TestLoadSteps(t *testing.T) {
	if len(steps) < 2 || steps[0].version != 1 || steps[0].name != "tables" {
		t.Errorf("embedded steps = %+v, want 0001_tables first", steps)
	}
	for _, st := range steps {
		c, _ := newConfig(nil)
		if rest := c.expand(st.sql); strings.Contains(rest, "{{") {
			t.Errorf("step %d keeps a placeholder after expansion", st.version)
		}
	}
	file := &fstest.MapFile{Data: []byte("SELECT 1;")}
	tests := []struct {
		name  string
		files fstest.MapFS
		want  string
	}{
		{"none", fstest.MapFS{}, "no migrations"},
		{"no label", fstest.MapFS{"migrations/0001.sql": file}, "want a name NNNN_name.sql"},
		{"short number", fstest.MapFS{"migrations/1_x.sql": file}, "want a name NNNN_name.sql"},
		{"gap", fstest.MapFS{"migrations/0001_a.sql": file, "migrations/0003_c.sql": file}, "0003_c.sql: want number 0002"},
		{"not first", fstest.MapFS{"migrations/0002_b.sql": file}, "want number 0001"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadSteps(tt.files)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("loadSteps: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// migrations returns the schema's version table, version to applied_at.
func migrations(t testing.TB, pool *pgxpool.Pool, schema string) map[int32]time.Time {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT version, applied_at FROM "+pgx.Identifier{schema}.Sanitize()+".schema_migrations")
	if err != nil {
		t.Fatalf("read %s.schema_migrations: %v", schema, err)
	}
	got := map[int32]time.Time{}
	var v int32
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&v, &at}, func() error { got[v] = at; return nil })
	if err != nil {
		t.Fatalf("read %s.schema_migrations: %v", schema, err)
	}
	return got
}

// wantAllSteps fails the test unless every step is recorded once.
func wantAllSteps(t testing.TB, got map[int32]time.Time) {
	t.Helper()
	if len(got) != len(steps) {
		t.Fatalf("schema_migrations = %v, want versions 1 to %d", got, len(steps))
	}
	for _, st := range steps {
		if _, ok := got[int32(st.version)]; !ok {
			t.Fatalf("schema_migrations = %v, want versions 1 to %d", got, len(steps))
		}
	}
}

func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	first := migrations(t, pool, "sluice")
	wantAllSteps(t, first)
	for range 2 {
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
	}
	if again := migrations(t, pool, "sluice"); fmt.Sprint(again) != fmt.Sprint(first) {
		t.Errorf("schema_migrations after more Migrates = %v, want %v", again, first)
	}
	// The lock was released, though the session that held it lives on in
	// the pool. Advisory locks belong to a database, and this one is the
	// test's own.
	held := queryInt(t, pool, `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if held != 0 {
		t.Errorf("%d advisory locks held after Migrate, want 0", held)
	}
}

// TestMigrateConcurrent starts replicas together: for each schema, four
// goroutines over two pools call Migrate at once. Every step creates its
// objects without IF NOT EXISTS, so a step applied twice would fail.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	db := servers.Postgres(t)
	pools := []*pgxpool.Pool{db.Pool(t), db.Pool(t)}
	const schemas, replicas = 5, 4
	for i := range schemas {
		schema := fmt.Sprintf("replica_%d", i)
		start := make(chan struct{})
		errs := make([]error, replicas)
		var wg sync.WaitGroup
		for r := range replicas {
			s, err := New(pools[r%len(pools)], WithSchema(schema))
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				<-start
				errs[r] = s.Migrate(context.Background())
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("schema %s: concurrent Migrate: %v", schema, err)
		}
		wantAllSteps(t, migrations(t, pools[0], schema))
	}
}

// TestMigrationSQLByHand applies the script as a DBA would, then checks
// that Migrate has nothing to do, that the schema works, and that the
// script applied again stops at its first step, changing nothing.
func TestMigrationSQLByHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := servers.Postgres(t)
	pool := db.Pool(t)
	script, err := MigrationSQL(WithSchema("by_hand"), WithChannel("by_hand_events"))
	if err != nil {
		t.Fatalf("MigrationSQL: %v", err)
	}
	for _, want := range []string{`"by_hand".plans`, "pg_notify('by_hand_events'", "pg_advisory_lock(hashtext('by_hand.schema_migrations'))", "COMMIT;"} {
		if !strings.Contains(script, want) {
			t.Errorf("script does not contain %s", want)
		}
	}
	conn, err := pgconn.Connect(ctx, db.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// One simple-protocol query runs the statements in order, as psql -f
	// does: the script's BEGIN and COMMIT make its transactions.
	if _, err := conn.Exec(ctx, script).ReadAll(); err != nil {
		t.Fatalf("apply the script: %v", err)
	}
	byHand := migrations(t, pool, "by_hand")
	wantAllSteps(t, byHand)

	s := migrated(t, pool, WithSchema("by_hand"), WithChannel("by_hand_events"))
	if after := migrations(t, pool, "by_hand"); fmt.Sprint(after) != fmt.Sprint(byHand) {
		t.Errorf("Migrate after the script changed schema_migrations from %v to %v", byHand, after)
	}
	p := putPlan(t, s, proPlan())
	if v := assign(t, s, "c1", "pro"); v <= p.Version {
		t.Errorf("assignment version %d after plan version %d: the triggers are missing", v, p.Version)
	}

	_, err = conn.Exec(ctx, script).ReadAll()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != "schema_migrations_pkey" {
		t.Fatalf("script applied again: %v, want a unique violation on schema_migrations_pkey", err)
	}
	if got := lookup(t, s, "c1"); got.Plan.Name != "pro" {
		t.Errorf("after the script failed, Lookup = %+v, want c1 still on pro", got)
	}
}

func TestMigrationSQLOptions(t *testing.T) {
	if _, err := MigrationSQL(WithSchema("Bad")); err == nil {
		t.Error("MigrationSQL(WithSchema(Bad)) returned no error")
	}
	script, err := MigrationSQL()
	if err != nil || !strings.Contains(script, `"sluice".schema_migrations`) || !strings.Contains(script, "'sluice_changes'") {
		t.Errorf("MigrationSQL() = %v, and a script without the default schema and channel", err)
	}
}

// TestMigrateSchemas: two schemas in one database are independent stores.
func TestMigrateSchemas(t *testing.T) {
	t.Parallel()
	pool := servers.Postgres(t).Pool(t)
	a := migrated(t, pool)
	b := migrated(t, pool, WithSchema("other"))
	putPlan(t, a, proPlan())
	assign(t, a, "c1", "pro")
	if got := lookup(t, b, "c1"); got.Version != 0 {
		t.Errorf("schema other sees c1 of schema sluice: %+v", got)
	}
}

// commitOrderStep is the step that serialises writers, so that versions
// follow commit order; schemas migrated by earlier releases have the steps
// before it.
const commitOrderStep = 3

// TestMigrateUpgrades brings a schema that an earlier release migrated,
// with plans and assignments in it, up to date: Migrate applies the later
// steps, keeps the rows and their versions, and from then on a write
// waits for an open transaction that wrote, and draws above it.
func TestMigrateUpgrades(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := servers.Postgres(t).Pool(t)
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, s.cfg.expand(bookkeepingSQL)); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps[:commitOrderStep-1] {
		if err := s.apply(ctx, conn.Conn(), st); err != nil {
			t.Fatal(err)
		}
	}
	conn.Release()
	pro := putPlan(t, s, proPlan())
	v := assign(t, s, "c1", "pro")

	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate of a schema at step %d: %v", commitOrderStep-1, err)
	}
	wantAllSteps(t, migrations(t, pool, "sluice"))
	if got := lookup(t, s, "c1"); got.Version != v || got.Plan.Version != pro.Version {
		t.Errorf("after the upgrade, Lookup = %+v; want c1 at version %d on pro at version %d, as before", got, v, pro.Version)
	}

	edit, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer edit.Rollback(ctx)
	var edited int64
	if err := edit.QueryRow(ctx, "UPDATE sluice.plans SET algorithm = 'GCRA' WHERE name = 'pro' RETURNING version").Scan(&edited); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var moved uint64
	go func() {
		var err error
		moved, err = s.Unassign(ctx, "c1")
		done <- err
	}()
	if servers.ReturnedOrWaiting(t, pool, done) {
		t.Fatalf("after the upgrade, Unassign returned (%v) while an edit was open: writers are not serialised", <-done)
	}
	if err := edit.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if moved <= uint64(edited) {
		t.Errorf("Unassign drew version %d after an edit that committed first at %d", moved, edited)
	}
}
