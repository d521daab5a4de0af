package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// version returns the version column of the row of table whose key is id.
func version(t testing.TB, pool *pgxpool.Pool, table, key, id string) int64 {
	t.Helper()
	return queryInt(t, pool, fmt.Sprintf("SELECT version FROM sluice.%s WHERE %s = $1", table, key), id)
}

// TestTriggersVersion writes as a DBA would: every insert and update takes
// the next version, whatever the statement says.
func TestTriggersVersion(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	putPlan(t, s, proPlan())
	free := proPlan()
	free.Name = "free"
	putPlan(t, s, free)

	execSQL(t, pool, "INSERT INTO sluice.assignments (subject, plan, version) VALUES ('c1', 'free', 999999)")
	v1 := version(t, pool, "assignments", "subject", "c1")
	if v1 >= 999999 {
		t.Fatalf("INSERT set version %d itself", v1)
	}
	execSQL(t, pool, "UPDATE sluice.assignments SET plan = 'pro' WHERE subject = 'c1'")
	v2 := version(t, pool, "assignments", "subject", "c1")
	if v2 <= v1 {
		t.Errorf("UPDATE of the plan: version %d after %d", v2, v1)
	}
	if got := lookup(t, s, "c1"); got.Plan.Name != "pro" || got.Version != uint64(v2) {
		t.Errorf("Lookup after the UPDATE = %+v, want pro at version %d", got, v2)
	}
	execSQL(t, pool, "UPDATE sluice.assignments SET version = 1 WHERE subject = 'c1'")
	if v3 := version(t, pool, "assignments", "subject", "c1"); v3 <= v2 {
		t.Errorf("UPDATE SET version = 1: version %d after %d, want it forward", v3, v2)
	}

	p1 := version(t, pool, "plans", "name", "pro")
	execSQL(t, pool, `UPDATE sluice.plans SET bandwidths = '[{"capacity":5,"refill_tokens":5,"refill_period":"1s","refill":"Greedy"}]', version = 0 WHERE name = 'pro'`)
	p2 := version(t, pool, "plans", "name", "pro")
	if p2 <= p1 {
		t.Errorf("UPDATE of a plan: version %d after %d", p2, p1)
	}
	if got := lookup(t, s, "c1"); got.Plan.Version != uint64(p2) || got.Plan.Bandwidths[0].Capacity != 5 {
		t.Errorf("Lookup after the plan UPDATE = %+v, want capacity 5 at version %d", got, p2)
	}
}

// TestTriggersDelete: deleting an assigned subject unassigns it at a new
// version, so its version never falls back to 0; an unassigned row may go.
func TestTriggersDelete(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	putPlan(t, s, proPlan())
	v := assign(t, s, "c1", "pro")

	execSQL(t, pool, "DELETE FROM sluice.assignments WHERE subject = 'c1'")
	got := lookup(t, s, "c1")
	if got.Plan.Name != "" || got.Version <= v {
		t.Fatalf("after DELETE, Lookup = %+v; want no plan at a version above %d", got, v)
	}
	execSQL(t, pool, "DELETE FROM sluice.assignments WHERE subject = 'c1'")
	if n := queryInt(t, pool, "SELECT count(*) FROM sluice.assignments"); n != 0 {
		t.Errorf("after deleting the unassigned row, %d rows remain", n)
	}
}

func TestTriggersNoRename(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	putPlan(t, s, proPlan())
	assign(t, s, "c1", "pro")
	_, err := pool.Exec(context.Background(), "UPDATE sluice.assignments SET subject = 'c2' WHERE subject = 'c1'")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.Hint == "" {
		t.Fatalf("renaming a subject: %v, want a check_violation with a hint", err)
	}
	if got := lookup(t, s, "c1"); got.Plan.Name != "pro" {
		t.Errorf("after the failed rename, Lookup(c1) = %+v", got)
	}
	// A plan in use cannot be renamed or deleted either: the foreign key
	// stops it.
	if _, err := pool.Exec(context.Background(), "DELETE FROM sluice.plans WHERE name = 'pro'"); !errors.As(err, &pgErr) || pgErr.Code != "23503" {
		t.Errorf("deleting a plan in use: %v, want a foreign_key_violation", err)
	}
}

// listenRaw listens on channel on a connection of its own, as any client
// could.
func listenRaw(t testing.TB, pool *pgxpool.Pool, channel string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		t.Fatal(err)
	}
	return conn
}

// next returns the next payload on conn.
func next(t testing.TB, conn *pgx.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("wait for a notification: %v", err)
	}
	return n.Payload
}

// TestTriggersNotify checks the payload of every kind of write, by the
// store and by hand, in commit order.
func TestTriggersNotify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	conn := listenRaw(t, pool, "sluice_changes")
	expect := func(what string, want string) {
		t.Helper()
		if got := next(t, conn); got != want {
			t.Errorf("%s: payload %q, want %q", what, got, want)
		}
	}
	row := func(table, key, id string) int64 { return version(t, pool, table, key, id) }

	p := putPlan(t, s, proPlan())
	expect("PutPlan", fmt.Sprintf("plan:pro:%d", p.Version))
	v := assign(t, s, "tenant:42:key", "pro")
	expect("Assign of a subject with colons", fmt.Sprintf("subject:tenant:42:key:%d", v))
	execSQL(t, pool, `UPDATE sluice.plans SET algorithm = 'GCRA' WHERE name = 'pro'`)
	expect("UPDATE of a plan", fmt.Sprintf("plan:pro:%d", row("plans", "name", "pro")))
	execSQL(t, pool, `UPDATE sluice.assignments SET plan = 'pro' WHERE subject = 'tenant:42:key'`)
	expect("UPDATE of an assignment", fmt.Sprintf("subject:tenant:42:key:%d", row("assignments", "subject", "tenant:42:key")))
	u, err := s.Unassign(ctx, "tenant:42:key")
	if err != nil {
		t.Fatal(err)
	}
	expect("Unassign", fmt.Sprintf("subject:tenant:42:key:%d", u))
	assign(t, s, "c1", "pro")
	next(t, conn)
	execSQL(t, pool, `DELETE FROM sluice.assignments WHERE subject = 'c1'`)
	expect("DELETE of an assigned subject", fmt.Sprintf("subject:c1:%d", row("assignments", "subject", "c1")))

	free := proPlan()
	free.Name = "free"
	putPlan(t, s, free)
	next(t, conn)
	execSQL(t, pool, `UPDATE sluice.plans SET name = 'basic' WHERE name = 'free'`)
	renamed := row("plans", "name", "basic")
	expect("rename, new name", fmt.Sprintf("plan:basic:%d", renamed))
	expect("rename, old name", fmt.Sprintf("plan:free:%d", renamed))
	execSQL(t, pool, `DELETE FROM sluice.plans WHERE name = 'basic'`)
	last := queryInt(t, pool, "SELECT last_value FROM sluice.version_seq")
	expect("DELETE of a plan", fmt.Sprintf("plan:basic:%d", last))

	// Every payload the triggers send is one the listener reads.
	for _, payload := range []string{fmt.Sprintf("subject:tenant:42:key:%d", v), fmt.Sprintf("plan:basic:%d", last)} {
		if _, err := parsePayload(payload); err != nil {
			t.Errorf("parsePayload(%q): %v", payload, err)
		}
	}
}

// TestTriggersRollback: a write rolled back notifies nobody.
func TestTriggersRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	conn := listenRaw(t, pool, "sluice_changes")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO sluice.plans (name, algorithm, bandwidths) VALUES ('x', 'GCRA', '[]')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	p := putPlan(t, s, proPlan())
	if got, want := next(t, conn), fmt.Sprintf("plan:pro:%d", p.Version); got != want {
		t.Errorf("first payload after a rollback = %q, want %q", got, want)
	}
}
