package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

const (
	// DefaultSchema is the schema that holds the store's tables, unless
	// [WithSchema] names another.
	DefaultSchema = "sluice"
	// ChannelSuffix makes the default channel of a schema: without
	// [WithChannel], the store notifies on <schema>_changes
	// ("sluice_changes").
	ChannelSuffix = "_changes"
	// MaxSubjectLen is the longest subject, in bytes: a subject names a
	// bucket, whose key is at most [ratelimit.MaxKeyLen] bytes.
	MaxSubjectLen = ratelimit.MaxKeyLen
	// maxIdentLen is PostgreSQL's limit on names (NAMEDATALEN-1).
	maxIdentLen = 63
)

var (
	// ErrUnknownPlan is returned for a plan the store does not hold: by
	// [Store.Assign] for the plan to assign, and by [Store.Plan].
	ErrUnknownPlan = errors.New("postgres: unknown plan")
	// ErrInvalidSubject is returned by [Store.Assign] and [Store.Unassign]
	// for a subject that is empty, longer than [MaxSubjectLen] bytes, or
	// not UTF-8 free of NUL bytes, which PostgreSQL's text cannot hold.
	ErrInvalidSubject = errors.New("postgres: invalid subject")
)

// Option configures a [Store], and the script [MigrationSQL] writes.
type Option func(*config)

type config struct {
	schema  string
	channel string // "" until set: derived from schema
}

// WithSchema sets the schema that holds the store's tables, by default
// [DefaultSchema]. It must be 1 to 63 lower-case ASCII letters, digits and
// underscores, not starting with a digit or "pg_", so that it needs no
// quoting in hand-written SQL.
func WithSchema(name string) Option { return func(c *config) { c.schema = name } }

// WithChannel sets the channel the triggers notify and [Store.Listen]
// listens on, by default the schema's name followed by [ChannelSuffix]. It
// must be 1 to 63 lower-case ASCII letters, digits and underscores, not
// starting with a digit. The channel is written into the triggers by
// [Store.Migrate], so it must not change once the schema is migrated.
func WithChannel(name string) Option { return func(c *config) { c.channel = name } }

// newConfig applies opts to the defaults and checks the result.
func newConfig(opts []Option) (config, error) {
	c := config{schema: DefaultSchema}
	for _, opt := range opts {
		opt(&c)
	}
	if err := checkIdent("WithSchema", c.schema); err != nil {
		return config{}, err
	}
	if strings.HasPrefix(c.schema, "pg_") {
		return config{}, fmt.Errorf("postgres: WithSchema(%q): names starting with pg_ are reserved for system schemas", c.schema)
	}
	if c.channel == "" {
		c.channel = c.schema + ChannelSuffix
		if len(c.channel) > maxIdentLen {
			return config{}, fmt.Errorf("postgres: the channel %q derived from schema %q is longer than %d bytes; choose one with WithChannel",
				c.channel, c.schema, maxIdentLen)
		}
	}
	if err := checkIdent("WithChannel", c.channel); err != nil {
		return config{}, err
	}
	return c, nil
}

// checkIdent checks a name the store puts in SQL: lower-case, so that it
// means the same quoted or not.
func checkIdent(option, name string) error {
	if name == "" || len(name) > maxIdentLen {
		return fmt.Errorf("postgres: %s(%q): must be 1 to %d bytes", option, name, maxIdentLen)
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r == '_':
		case r >= '0' && r <= '9':
			if i == 0 {
				return fmt.Errorf("postgres: %s(%q): must not start with a digit", option, name)
			}
		default:
			return fmt.Errorf("postgres: %s(%q): %q is not a lower-case ASCII letter, digit or underscore", option, name, r)
		}
	}
	return nil
}

// schemaIdent is the schema as a quoted identifier.
func (c config) schemaIdent() string { return pgx.Identifier{c.schema}.Sanitize() }

// expand puts the schema, as a quoted identifier, and the channel, as a
// string literal, into sql's {{schema}} and {{channel}}. Both were checked
// to hold no quotes.
func (c config) expand(sql string) string {
	return strings.NewReplacer("{{schema}}", c.schemaIdent(), "{{channel}}", "'"+c.channel+"'").Replace(sql)
}

// Store is a [plans.Store] in PostgreSQL, with the admin calls that write
// plans and assignments and the change feed [Store.Listen]. It is safe for
// concurrent use.
type Store struct {
	pool *pgxpool.Pool
	cfg  config
	sql  queries
}

var _ plans.Store = (*Store)(nil)

// queries are the store's statements, for its schema.
type queries struct {
	lookup, plan, putPlan, assign string
}

func newQueries(c config) queries {
	return queries{
		lookup: c.expand(`SELECT a.version, p.name, p.version, p.algorithm, p.bandwidths
FROM {{schema}}.assignments a LEFT JOIN {{schema}}.plans p ON p.name = a.plan
WHERE a.subject = $1`),
		plan: c.expand(`SELECT version, algorithm, bandwidths FROM {{schema}}.plans WHERE name = $1`),
		putPlan: c.expand(`INSERT INTO {{schema}}.plans (name, algorithm, bandwidths) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET algorithm = excluded.algorithm, bandwidths = excluded.bandwidths
RETURNING version`),
		assign: c.expand(`INSERT INTO {{schema}}.assignments (subject, plan) VALUES ($1, $2)
ON CONFLICT (subject) DO UPDATE SET plan = excluded.plan
RETURNING version`),
	}
}

// New returns a store over pool, which stays the caller's: the store never
// closes it. New does no I/O; call [Store.Migrate] to create or update the
// schema. A nil pool or an invalid option is an error.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres: New: nil pool")
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, cfg: c, sql: newQueries(c)}, nil
}

// Lookup returns subject's assignment and its plan, in one query. A
// subject the store does not hold, or could not hold (see
// [ErrInvalidSubject]), is an Assignment with Version 0 and no plan; an
// unassigned subject has its version and no plan. A plan row that is not a
// valid plan is an error wrapping [plans.ErrInvalidPlan] that names the
// plan, its version and the field. When ctx ends the call, the error
// wraps ctx's error.
func (s *Store) Lookup(ctx context.Context, subject string) (plans.Assignment, error) {
	a := plans.Assignment{Subject: subject}
	if checkSubject(subject) != nil {
		return a, nil
	}
	var (
		version             int64
		planName, algorithm *string
		planVersion         *int64
		bandwidths          []byte
	)
	err := s.pool.QueryRow(ctx, s.sql.lookup, subject).Scan(&version, &planName, &planVersion, &algorithm, &bandwidths)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return a, nil
	case err != nil:
		return plans.Assignment{}, dbError(ctx, fmt.Sprintf("lookup subject %q", subject), err)
	case version < 1:
		return plans.Assignment{}, fmt.Errorf("postgres: lookup subject %q: %w: assignment version %d is not positive",
			subject, plans.ErrInvalidPlan, version)
	}
	a.Version = uint64(version)
	if planName == nil {
		return a, nil
	}
	a.Plan, err = planFromRow(*planName, *planVersion, *algorithm, bandwidths)
	if err != nil {
		return plans.Assignment{}, fmt.Errorf("postgres: lookup subject %q: %w", subject, err)
	}
	return a, nil
}

// planFromRow is [plans.PlanFromRow] for a row, whose version, a bigint,
// may be negative after hand-written SQL with the triggers disabled.
func planFromRow(name string, version int64, algorithm string, bandwidths []byte) (plans.Plan, error) {
	if version < 1 {
		return plans.Plan{}, fmt.Errorf("%w: plan %q version %d: version is not positive", plans.ErrInvalidPlan, name, version)
	}
	return plans.PlanFromRow(name, uint64(version), algorithm, bandwidths)
}

// dbError wraps a database error of the call what describes. When ctx
// ended the call, the error wraps ctx's error too, so that errors.Is(err,
// context.Canceled) says the caller gave up.
func dbError(ctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w: %w", ctxErr, err)
	}
	return fmt.Errorf("postgres: %s: %w", what, err)
}

// Plan returns the plan called name as stored. A plan the store does not
// hold is an error wrapping [ErrUnknownPlan]; a row that is not a valid
// plan, one wrapping [plans.ErrInvalidPlan].
func (s *Store) Plan(ctx context.Context, name string) (plans.Plan, error) {
	var (
		version    int64
		algorithm  string
		bandwidths []byte
	)
	err := s.pool.QueryRow(ctx, s.sql.plan, name).Scan(&version, &algorithm, &bandwidths)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return plans.Plan{}, fmt.Errorf("%w %q", ErrUnknownPlan, name)
	case err != nil:
		return plans.Plan{}, dbError(ctx, fmt.Sprintf("read plan %q", name), err)
	}
	p, err := planFromRow(name, version, algorithm, bandwidths)
	if err != nil {
		return plans.Plan{}, fmt.Errorf("postgres: read plan %q: %w", name, err)
	}
	return p, nil
}

// PutPlan creates plan p.Name, or revises it, with p's algorithm and
// bandwidths, and returns it at the version the database gave it; p's own
// Version is ignored. A plan that [plans.Plan.Validate] rejects is an
// error wrapping [plans.ErrInvalidPlan], and nothing is written. Subjects
// on the plan take the new revision on their next lookup. While another
// transaction that wrote a plan or an assignment is open, PutPlan waits for
// it to end, or for ctx to (see Versions in the package doc).
func (s *Store) PutPlan(ctx context.Context, p plans.Plan) (plans.Plan, error) {
	// Validate wants a version, which only the write draws: check with the
	// caller's when it is one, else with the first.
	check := p
	if check.Version < 1 || check.Version > plans.MaxVersion {
		check.Version = 1
	}
	if err := check.Validate(); err != nil {
		return plans.Plan{}, fmt.Errorf("postgres: put plan %q: %w", p.Name, err)
	}
	bandwidths, err := plans.MarshalBandwidths(p.Bandwidths)
	if err != nil {
		return plans.Plan{}, fmt.Errorf("postgres: put plan %q: %w", p.Name, err)
	}
	var version int64
	if err := s.pool.QueryRow(ctx, s.sql.putPlan, p.Name, p.Algorithm.String(), bandwidths).Scan(&version); err != nil {
		return plans.Plan{}, dbError(ctx, fmt.Sprintf("put plan %q", p.Name), err)
	}
	p.Version = uint64(version)
	return p, nil
}

// Assign puts subject on plan, which the store must hold, and returns the
// assignment's new version. An unknown plan is an error wrapping
// [ErrUnknownPlan], a bad subject one wrapping [ErrInvalidSubject]; either
// way nothing is written. An empty plan is an error too: [Store.Unassign]
// takes a subject off its plan. Like [Store.PutPlan], Assign waits for an
// open transaction that wrote.
func (s *Store) Assign(ctx context.Context, subject, plan string) (uint64, error) {
	if plan == "" {
		return 0, fmt.Errorf("postgres: assign subject %q: empty plan name; Unassign takes a subject off its plan", subject)
	}
	return s.place(ctx, subject, &plan)
}

// Unassign takes subject off its plan and returns the assignment's new
// version. The row stays, with no plan, so that the subject's version
// never decreases; a subject the store did not hold gets such a row too.
// Like [Store.PutPlan], Unassign waits for an open transaction that wrote.
func (s *Store) Unassign(ctx context.Context, subject string) (uint64, error) {
	return s.place(ctx, subject, nil)
}

// place writes subject's assignment to plan, nil for none.
func (s *Store) place(ctx context.Context, subject string, plan *string) (uint64, error) {
	if err := checkSubject(subject); err != nil {
		return 0, err
	}
	var version int64
	err := s.pool.QueryRow(ctx, s.sql.assign, subject, plan).Scan(&version)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "23503": // foreign_key_violation
		return 0, fmt.Errorf("postgres: assign subject %q: %w %q", subject, ErrUnknownPlan, *plan)
	case err != nil && plan == nil:
		return 0, dbError(ctx, fmt.Sprintf("unassign subject %q", subject), err)
	case err != nil:
		return 0, dbError(ctx, fmt.Sprintf("assign subject %q to plan %q", subject, *plan), err)
	}
	return uint64(version), nil
}

// checkSubject says whether the store can hold subject.
func checkSubject(subject string) error {
	switch {
	case subject == "" || len(subject) > MaxSubjectLen:
		return fmt.Errorf("%w: subject must be 1 to %d bytes, got %d", ErrInvalidSubject, MaxSubjectLen, len(subject))
	case !utf8.ValidString(subject) || strings.IndexByte(subject, 0) >= 0:
		return fmt.Errorf("%w: subject %q must be UTF-8 without NUL bytes", ErrInvalidSubject, subject)
	}
	return nil
}
