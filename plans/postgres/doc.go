// Package postgres is a [plans.Store] in PostgreSQL, over the
// *pgxpool.Pool (pgx v5) a service already has: [Store.Lookup] reads a
// subject's assignment and plan in one query, admin calls write them, and
// [Store.Listen] turns the database's notifications into
// [plans.Invalidator] calls, so that a [plans.Cache] picks up a change
// within a round trip of its commit.
//
// # Schema
//
// The store keeps its tables in a schema of its own ([DefaultSchema],
// "sluice", or [WithSchema]):
//
//	plans(name text primary key, version bigint, algorithm text, bandwidths jsonb, updated_at timestamptz)
//	assignments(subject text primary key, plan text null references plans(name), version bigint, updated_at timestamptz)
//
// A NULL plan means the subject is on no plan: Unassign keeps the row, so
// that the subject's version never goes back. Every version comes from one
// sequence, and triggers set it on every insert and update, whatever the
// statement says, so a DBA's hand-written
//
//	UPDATE sluice.assignments SET plan = 'pro' WHERE subject = 'c1';
//
// moves c1's version forward and notifies listeners as [Store.Assign]
// would. Deleting an assigned subject unassigns it instead, for the same
// reason; a subject cannot be renamed. TRUNCATE skips row triggers: it
// notifies nobody and sends subjects' versions back to 0, so do not use it
// on a live schema. The bandwidths are JSON, as
// [plans.ParseBandwidths] reads them:
//
//	[{"id":"burst","capacity":100,"refill_tokens":100,"refill_period":"1m","refill":"Greedy"}]
//
// They are checked on every read, not by the database: a bad row is an
// error from [Store.Lookup] for the subjects on that plan (naming the plan,
// its version and the field), never a wrong limit and never a panic.
//
// # Versions
//
// Versions follow commit order. Every statement that writes either table
// first takes one transaction-scoped advisory lock (the function
// <schema>.lock_versions() takes it), and the transaction holds it until
// it ends; versions are drawn only under it. A transaction thus draws
// above every transaction that committed before it, and [Store.Lookup],
// which reads the assignment and its plan in one statement, never finds
// two configs at one config version, whichever replica reads when. The
// cost: a transaction that writes a plan or an assignment and stays open
// makes every other write wait until it ends ([Store.PutPlan],
// [Store.Assign] and [Store.Unassign] until their context ends). Reads
// never wait. Writers wait on the lock before they lock any row, so they
// cannot deadlock; a hand-written transaction that locks rows
// (SELECT ... FOR UPDATE) before its first write should call
// <schema>.lock_versions() first.
//
// # Migrations
//
// Nothing changes the schema unless [Store.Migrate] is called. The steps
// are embedded SQL files, applied in order, each in a transaction of its
// own and recorded in <schema>.schema_migrations. Migrate holds a session
// advisory lock keyed on the schema, so replicas that start together
// migrate once. [MigrationSQL] returns the same steps as one script for a
// DBA to apply with psql. The migrations are hand-rolled rather than tern
// (whose v2 pulls in sprig and its dependencies for templating this does
// not need) or goose (database/sql first, with global state).
//
// # Notifications
//
// Triggers send pg_notify on the store's channel ([WithChannel]) after
// every committed change, with the payload plan:<name>:<version> or
// subject:<subject>:<version>. The version follows the last colon, so
// names may hold colons. The channel is written into the triggers when the
// schema is migrated, so every Store on a schema must be opened with the
// options the schema was migrated with.
//
// [Store.Listen] listens on a connection of its own, not one of the
// pool's. It checks a quiet connection with a heartbeat, reconnects with
// backoff, and calls Resync after every (re)connect, since notifications
// sent while it was away are lost. It is hand-rolled rather than
// jackc/pgxlisten, which has neither heartbeat nor backoff.
//
// # Requirements
//
// PostgreSQL 11 or later. The pool's user needs the usual privileges on
// the schema's tables and sequence, and CREATE on the database to migrate.
//
// # Concurrency
//
// A [Store] is safe for concurrent use.
package postgres
