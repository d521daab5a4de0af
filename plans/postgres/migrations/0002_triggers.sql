-- Triggers that keep versions moving forward and tell listeners of every
-- change, so that hand-written SQL behaves as the store's own writes do.

-- Every insert and update of a plan takes the next version, whatever version
-- the statement set.
CREATE FUNCTION {{schema}}.plans_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := nextval('{{schema}}.version_seq');
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

-- As plans_version, for assignments. A subject cannot be renamed: its old
-- name would drop back to version 0.
CREATE FUNCTION {{schema}}.assignments_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.subject <> OLD.subject THEN
        RAISE EXCEPTION 'sluice: subject % cannot be renamed to %', OLD.subject, NEW.subject
            USING ERRCODE = 'check_violation',
                  HINT = 'Unassign the old subject and assign the new one.';
    END IF;
    NEW.version := nextval('{{schema}}.version_seq');
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

-- Deleting an assigned subject unassigns it instead, at a new version: were
-- the row gone, the subject's version would drop back to 0 and buckets that
-- hold a later version would keep the old plan's limits. An unassigned row
-- may be deleted.
CREATE FUNCTION {{schema}}.assignments_keep_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.plan IS NULL THEN
        RETURN OLD;
    END IF;
    UPDATE {{schema}}.assignments SET plan = NULL WHERE subject = OLD.subject;
    RETURN NULL;
END
$$;

-- Payloads are <kind>:<id>:<version>, the version after the last colon, so
-- that ids may hold colons. A deleted plan is reported at a new version.
CREATE FUNCTION {{schema}}.plans_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
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

CREATE FUNCTION {{schema}}.assignments_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({{channel}}, 'subject:' || NEW.subject || ':' || NEW.version);
    RETURN NULL;
END
$$;

CREATE TRIGGER plans_version BEFORE INSERT OR UPDATE ON {{schema}}.plans
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.plans_version();
CREATE TRIGGER plans_notify AFTER INSERT OR UPDATE OR DELETE ON {{schema}}.plans
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.plans_notify();
CREATE TRIGGER assignments_version BEFORE INSERT OR UPDATE ON {{schema}}.assignments
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.assignments_version();
CREATE TRIGGER assignments_keep_version BEFORE DELETE ON {{schema}}.assignments
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.assignments_keep_version();
CREATE TRIGGER assignments_notify AFTER INSERT OR UPDATE ON {{schema}}.assignments
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.assignments_notify();
