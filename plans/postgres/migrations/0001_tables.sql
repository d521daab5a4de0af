-- Plans, and which plan each subject is on.
--
-- Every version comes from one sequence, for plans and assignments alike: a
-- subject's config version is the later of its assignment's and its plan's,
-- and it must never decrease, also when the subject moves to a plan that was
-- last revised long ago. The top is 2^53-1, the largest integer the Redis
-- backends' Lua scripts hold exactly.
CREATE SEQUENCE {{schema}}.version_seq AS bigint MAXVALUE 9007199254740991;

CREATE TABLE {{schema}}.plans (
    name       text PRIMARY KEY CHECK (name <> ''),
    -- Set by a trigger on every write: statements cannot choose it.
    version    bigint NOT NULL,
    -- A ratelimit.Algorithm's name: TokenBucket, GCRA, ...
    algorithm  text NOT NULL,
    -- [{"id":"burst","capacity":100,"refill_tokens":100,"refill_period":"1m",
    --   "refill":"Greedy"}, ...]; the store checks it on every read, so a bad
    -- value is an error for the subjects on the plan, never a wrong limit.
    bandwidths jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{schema}}.assignments (
    subject    text PRIMARY KEY CHECK (subject <> ''),
    -- NULL: the subject is on no plan (unassigned), at this row's version.
    plan       text REFERENCES {{schema}}.plans (name),
    -- Set by a trigger on every write: statements cannot choose it.
    version    bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- For the foreign key's check when a plan is deleted or renamed.
CREATE INDEX assignments_plan_idx ON {{schema}}.assignments (plan);

COMMENT ON TABLE {{schema}}.plans IS
    'sluice rate-limit plans. version is set by a trigger on every write; a write notifies listeners.';
COMMENT ON TABLE {{schema}}.assignments IS
    'sluice: the plan each subject is on. version is set by a trigger on every write; a write notifies listeners. '
    'DELETE of an assigned subject unassigns it (plan = NULL, a new version), so that its version never decreases; '
    'DELETE of an unassigned subject removes the row.';
