package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrationFiles are the schema's steps, NNNN_name.sql numbered from 0001
// with no gaps, with {{schema}} and {{channel}} for the store's.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// step is one migration.
type step struct {
	version int
	name    string
	sql     string // unexpanded
}

// steps are the migrations in order; a malformed file is a defect of the
// build, which the package's tests catch.
var steps = mustLoadSteps(migrationFiles)

func mustLoadSteps(fsys fs.FS) []step {
	s, err := loadSteps(fsys)
	if err != nil {
		panic(err)
	}
	return s
}

// loadSteps reads the migrations/*.sql of fsys and checks their numbering.
func loadSteps(fsys fs.FS) ([]step, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []step
	for i, name := range names { // fs.Glob sorts
		base := strings.TrimSuffix(path.Base(name), ".sql")
		num, label, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || len(num) != 4 || label == "" {
			return nil, fmt.Errorf("postgres: migration %s: want a name NNNN_name.sql", name)
		}
		if version != i+1 {
			return nil, fmt.Errorf("postgres: migration %s: want number %04d", name, i+1)
		}
		sql, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		out = append(out, step{version: version, name: label, sql: string(sql)})
	}
	if len(out) == 0 {
		return nil, errors.New("postgres: no migrations")
	}
	return out, nil
}

// bookkeepingSQL creates the schema and its version table, which every
// migration run needs before its steps.
const bookkeepingSQL = `CREATE SCHEMA IF NOT EXISTS {{schema}};
CREATE TABLE IF NOT EXISTS {{schema}}.schema_migrations (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);`

// recordSQL records a step as applied. It runs first in the step's
// transaction, so that a step applied already fails at once, on the key.
const recordSQL = `INSERT INTO {{schema}}.schema_migrations (version) VALUES (%d);`

// unlockTimeout bounds the release of the migration lock, which runs even
// when the caller's context has ended.
const unlockTimeout = 5 * time.Second

// lockKey is what the migration lock's key is hashed from: the version
// table's name, so that migrations of different schemas do not wait for
// each other.
func (c config) lockKey() string { return c.schema + ".schema_migrations" }

// Migrate creates the store's schema, or brings it up to date, and does
// nothing when it is. Each step runs in a transaction of its own and is
// recorded in <schema>.schema_migrations. Migrate holds a session advisory
// lock on the schema, the one the [MigrationSQL] script takes, so that
// replicas starting together, or a DBA's script and a replica, apply each
// step once. A schema migrated by a newer release is left as it is.
func (s *Store) Migrate(ctx context.Context) error {
	what := fmt.Sprintf("migrate schema %q", s.cfg.schema)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return dbError(ctx, what, err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", s.cfg.lockKey()); err != nil {
		// The lock may have been granted as the call failed: only the
		// session's end is sure to release it.
		discard(conn)
		return dbError(ctx, what+": take the migration lock", err)
	}
	err = s.migrateLocked(ctx, conn.Conn())
	unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	if _, unlockErr := conn.Exec(unlockCtx, "SELECT pg_advisory_unlock(hashtext($1))", s.cfg.lockKey()); unlockErr != nil {
		discard(conn)
	}
	if err != nil {
		return dbError(ctx, what, err)
	}
	return nil
}

// discard closes conn, so that the pool drops it rather than reuse a
// session that may hold the migration lock.
func discard(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	_ = conn.Conn().Close(ctx) // closed either way
}

// migrateLocked applies the steps conn's session finds missing.
func (s *Store) migrateLocked(ctx context.Context, conn *pgx.Conn) error {
	applied, err := s.appliedSteps(ctx, conn)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(steps, func(st step) bool { return !applied[st.version] }) {
		return nil
	}
	if _, err := conn.Exec(ctx, s.cfg.expand(bookkeepingSQL)); err != nil {
		return fmt.Errorf("create the version table: %w", err)
	}
	for _, st := range steps {
		if applied[st.version] {
			continue
		}
		if err := s.apply(ctx, conn, st); err != nil {
			return err
		}
	}
	return nil
}

// appliedSteps returns the versions recorded in the schema's version
// table, none when there is no table yet. Finding a fully migrated schema
// takes no DDL, so a user without CREATE privileges may call Migrate on a
// schema a DBA migrated.
func (s *Store) appliedSteps(ctx context.Context, conn *pgx.Conn) (map[int]bool, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.cfg.schemaIdent()+".schema_migrations").Scan(&exists); err != nil {
		return nil, fmt.Errorf("find the version table: %w", err)
	}
	applied := map[int]bool{}
	if !exists {
		return applied, nil
	}
	rows, err := conn.Query(ctx, s.cfg.expand("SELECT version FROM {{schema}}.schema_migrations"))
	if err != nil {
		return nil, fmt.Errorf("read the version table: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("read the version table: %w", err)
	}
	for _, v := range versions {
		applied[int(v)] = true
	}
	return applied, nil
}

// apply runs one step and records it, in one transaction.
func (s *Store) apply(ctx context.Context, conn *pgx.Conn, st step) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.cfg.expand(fmt.Sprintf(recordSQL, st.version))); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.cfg.expand(st.sql))
		return err
	})
	if err != nil {
		return fmt.Errorf("step %04d_%s: %w", st.version, st.name, err)
	}
	return nil
}

// MigrationSQL returns every migration step as one script, for a DBA to
// read, or to apply by hand instead of calling [Store.Migrate]:
//
//	psql -v ON_ERROR_STOP=1 -f sluice.sql
//
// It takes the options [New] takes, and must be given those the stores on
// the schema use. The script holds Migrate's advisory lock while it runs,
// and runs each step in a transaction of its own that first records the
// step in <schema>.schema_migrations, as Migrate does; Migrate then finds
// nothing to do. It is for a schema with none of the steps: on one with
// some, the first step applied already fails on the version table's key,
// and psql stops there, having repeated nothing.
func MigrationSQL(opts ...Option) (string, error) {
	c, err := newConfig(opts)
	if err != nil {
		return "", err
	}
	lock := "hashtext('" + c.lockKey() + "')"
	var b strings.Builder
	fmt.Fprintf(&b, "-- sluice plan store: schema %s, migration steps 1 to %d, notifying channel %s.\n",
		c.schemaIdent(), len(steps), c.channel)
	b.WriteString("-- Apply with: psql -v ON_ERROR_STOP=1 -f <this file>\n\n")
	fmt.Fprintf(&b, "SELECT pg_advisory_lock(%s);\n\n", lock)
	b.WriteString(c.expand(bookkeepingSQL))
	for _, st := range steps {
		fmt.Fprintf(&b, "\n\n-- Step %04d_%s\nBEGIN;\n%s\n%s", st.version, st.name,
			c.expand(fmt.Sprintf(recordSQL, st.version)), c.expand(st.sql))
		if !strings.HasSuffix(st.sql, "\n") {
			b.WriteString("\n")
		}
		b.WriteString("COMMIT;")
	}
	fmt.Fprintf(&b, "\n\nSELECT pg_advisory_unlock(%s);\n", lock)
	return b.String(), nil
}
