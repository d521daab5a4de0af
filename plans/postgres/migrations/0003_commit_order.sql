-- Versions in commit order.
--
-- Until this step the triggers drew a version when a statement ran, so a
-- transaction left open held a version below those of writes that
-- committed after it began. Issue 28: an edit of plan pro drew version 4 and
-- stayed open; Assign(c1, pro) committed at version 6; a replica that read
-- c1 between the two commits held pro's old limits at config version 6,
-- one that read after held the new limits at version 6. Under Additive
-- inheritance each replica's calls converted the bucket from the other's
-- config, and 1000 of 1000 alternating calls passed where pro allows 200.
--
-- From this step on, writers are serialised: every statement that writes
-- either table takes one lock of the transaction's scope (an advisory lock
-- keyed on the schema's sequence) before it touches a row, and holds it
-- until the transaction commits or rolls back. Why that is sound:
--
-- 1. A transaction draws versions only while it holds the lock: each
--    trigger that calls nextval takes the lock first (a no-op when held).
-- 2. Transactions hold the lock one at a time, and PostgreSQL releases a
--    transaction's locks only once its commit is visible to new snapshots.
--    So the versions of every transaction are above those of all that held
--    the lock before it, and those had committed, or rolled back, before it
--    drew its first. Versions are in commit order.
-- 3. A reader that takes a subject's assignment and its plan in one
--    statement (one snapshot, as Store.Lookup does) and finds config version
--    V, the later of the two rows' versions, sees every commit that drew a
--    version below V. A later snapshot that still finds V holds the same two
--    rows: a commit that changed either would have drawn a version above V.
--    So one config version names one config, whichever replica read it.
--
-- Notifications follow: PostgreSQL queues them in commit order, so a
-- listener now receives versions in increasing order (a renamed plan's two
-- payloads share one).
--
-- The lock is taken by a statement trigger, before the statement locks any
-- row, so that writers, the store's or hand-written, wait for one another
-- on it and never on each other's rows: they cannot deadlock. A
-- transaction that locks rows of these tables (SELECT ... FOR UPDATE)
-- before its first write can: PostgreSQL then aborts one side with
-- deadlock_detected. Such a transaction should call
-- <schema>.lock_versions() first. Readers take no lock and never wait.
--
-- The cost: a transaction that writes a plan or an assignment and stays
-- open makes every other writer wait until it ends (lock_timeout bounds the
-- wait). Commits were serialised already: PostgreSQL's NOTIFY holds a
-- cluster-wide lock through the commit of every notifying transaction.
--
-- A sequence that caches values per session (CACHE above 1) would hand out
-- values out of draw order; the sequence keeps the default, stated here.
ALTER SEQUENCE {{schema}}.version_seq CACHE 1;

-- lock_versions takes the writers' lock, which the transaction then holds
-- until it ends. Calling it again is a no-op.
CREATE FUNCTION {{schema}}.lock_versions() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('{{schema}}.version_seq'));
END
$$;

CREATE FUNCTION {{schema}}.lock_versions_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {{schema}}.lock_versions();
    RETURN NULL;
END
$$;

-- For INSERT ... ON CONFLICT DO UPDATE, both the INSERT and the UPDATE
-- statement triggers fire before any row is touched.
CREATE TRIGGER plans_lock BEFORE INSERT OR UPDATE OR DELETE ON {{schema}}.plans
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.lock_versions_trigger();
CREATE TRIGGER assignments_lock BEFORE INSERT OR UPDATE OR DELETE ON {{schema}}.assignments
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.lock_versions_trigger();

-- The functions of 0002 that draw a version, each now taking the lock
-- first: the statement trigger has taken it, but row triggers fire where
-- statement triggers do not (logical replication's apply, for one), and
-- the version is sound only if drawn under the lock.
CREATE OR REPLACE FUNCTION {{schema}}.plans_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {{schema}}.lock_versions();
    NEW.version := nextval('{{schema}}.version_seq');
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.assignments_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.subject <> OLD.subject THEN
        RAISE EXCEPTION 'sluice: subject % cannot be renamed to %', OLD.subject, NEW.subject
            USING ERRCODE = 'check_violation',
                  HINT = 'Unassign the old subject and assign the new one.';
    END IF;
    PERFORM {{schema}}.lock_versions();
    NEW.version := nextval('{{schema}}.version_seq');
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.plans_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM {{schema}}.lock_versions();
        PERFORM pg_notify({{channel}}, 'plan:' || OLD.name || ':' || nextval('{{schema}}.version_seq'));
        RETURN NULL;
    END IF;
    PERFORM pg_notify({{channel}}, 'plan:' || NEW.name || ':' || NEW.version);
    IF TG_OP = 'UPDATE' AND NEW.name <> OLD.name THEN
        PERFORM pg_notify({{channel}}, 'plan:' || OLD.name || ':' || NEW.version);
    END IF;
    RETURN NULL;
END
$$;
