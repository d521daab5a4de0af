package postgres

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestNewOptions(t *testing.T) {
	long := strings.Repeat("s", 63)
	tests := []struct {
		name        string
		opts        []Option
		wantSchema  string
		wantChannel string
		wantErr     string // "" for no error
	}{
		{name: "defaults", wantSchema: "sluice", wantChannel: "sluice_changes"},
		{name: "schema derives the channel", opts: []Option{WithSchema("billing_2")}, wantSchema: "billing_2", wantChannel: "billing_2_changes"},
		{name: "channel", opts: []Option{WithChannel("plan_events")}, wantSchema: "sluice", wantChannel: "plan_events"},
		{name: "63 bytes with a channel", opts: []Option{WithSchema(long), WithChannel("c")}, wantSchema: long, wantChannel: "c"},
		{name: "empty schema", opts: []Option{WithSchema("")}, wantErr: `WithSchema(""): must be 1 to 63 bytes`},
		{name: "long schema", opts: []Option{WithSchema(long + "s"), WithChannel("c")}, wantErr: "WithSchema(\"" + long + "s\"): must be 1 to 63 bytes"},
		{name: "upper case", opts: []Option{WithSchema("Sluice")}, wantErr: `WithSchema("Sluice"): 'S' is not a lower-case ASCII letter`},
		{name: "quote", opts: []Option{WithSchema(`a"b`)}, wantErr: `WithSchema("a\"b"): '"' is not`},
		{name: "dot", opts: []Option{WithSchema("a.b")}, wantErr: `WithSchema("a.b"): '.' is not`},
		{name: "digit first", opts: []Option{WithSchema("1st")}, wantErr: `WithSchema("1st"): must not start with a digit`},
		{name: "system prefix", opts: []Option{WithSchema("pg_plans")}, wantErr: `WithSchema("pg_plans"): names starting with pg_ are reserved`},
		{name: "derived channel too long", opts: []Option{WithSchema(long)}, wantErr: "is longer than 63 bytes; choose one with WithChannel"},
		{name: "bad channel", opts: []Option{WithChannel("plan-events")}, wantErr: `WithChannel("plan-events"): '-' is not`},
		{name: "empty channel means derived", opts: []Option{WithChannel("")}, wantSchema: "sluice", wantChannel: "sluice_changes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := newConfig(tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("newConfig = %+v, %v; want an error containing %q", c, err, tt.wantErr)
				}
				return
			}
			if err != nil || c.schema != tt.wantSchema || c.channel != tt.wantChannel {
				t.Fatalf("newConfig = %+v, %v; want schema %q, channel %q", c, err, tt.wantSchema, tt.wantChannel)
			}
		})
	}
	if _, err := New(nil); err == nil {
		t.Error("New(nil) returned no error")
	}
}

func TestLookup(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	pro := putPlan(t, s, proPlan())
	v := assign(t, s, "c1", "pro")
	gone := assign(t, s, "c2", "pro")
	unassigned, err := s.Unassign(context.Background(), "c2")
	if err != nil {
		t.Fatalf("Unassign: %v", err)
	}

	tests := []struct {
		subject string
		want    plans.Assignment
	}{
		{"c1", plans.Assignment{Subject: "c1", Version: v, Plan: pro}},
		{"unknown", plans.Assignment{Subject: "unknown"}},
		{"c2", plans.Assignment{Subject: "c2", Version: unassigned}},
		{"", plans.Assignment{}},
		{strings.Repeat("x", MaxSubjectLen+1), plans.Assignment{Subject: strings.Repeat("x", MaxSubjectLen+1)}},
		{"bad\xffutf8", plans.Assignment{Subject: "bad\xffutf8"}},
		{"nul\x00", plans.Assignment{Subject: "nul\x00"}},
	}
	for _, tt := range tests {
		got := lookup(t, s, tt.subject)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Lookup(%.20q) =\n%+v\nwant\n%+v", tt.subject, got, tt.want)
		}
	}
	if !(pro.Version < v && v < gone && gone < unassigned) {
		t.Errorf("versions %d (plan), %d, %d, %d (assignments) do not follow one sequence", pro.Version, v, gone, unassigned)
	}
}

// TestConfigVersionNeverDecreases moves a subject between plans revised at
// different times: because every version comes from one sequence, its
// config version only grows.
func TestConfigVersionNeverDecreases(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	a, b := proPlan(), proPlan()
	a.Name, b.Name = "a", "b"
	putPlan(t, s, a)
	putPlan(t, s, b)
	unassign := func() {
		if _, err := s.Unassign(context.Background(), "c"); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		what  string
		do    func()
		grows bool
	}{
		{"assign to b", func() { assign(t, s, "c", "b") }, true},
		{"revise a, which c is not on", func() { putPlan(t, s, a) }, false},
		{"move to a", func() { assign(t, s, "c", "a") }, true},
		{"move back to b, revised before a", func() { assign(t, s, "c", "b") }, true},
		{"revise b", func() { putPlan(t, s, b) }, true},
		{"unassign", unassign, true},
	}
	var last uint64
	for _, st := range steps {
		st.do()
		got := lookup(t, s, "c").ConfigVersion()
		if (st.grows && got <= last) || (!st.grows && got != last) {
			t.Errorf("after %s, ConfigVersion = %d, was %d (want it to grow: %v)", st.what, got, last, st.grows)
		}
		last = got
	}
}

func TestLookupCanceled(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Lookup(ctx, "c1"); !errors.Is(err, context.Canceled) {
		t.Errorf("Lookup with a canceled context: %v, want context.Canceled", err)
	}
	if _, err := s.PutPlan(ctx, proPlan()); !errors.Is(err, context.Canceled) {
		t.Errorf("PutPlan with a canceled context: %v, want context.Canceled", err)
	}
	if err := s.Migrate(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Migrate with a canceled context: %v, want context.Canceled", err)
	}
	if got := lookup(t, s, "c1"); got.Version != 0 {
		t.Errorf("Lookup after the canceled calls = %+v, want an unknown subject", got)
	}
}

func TestLookupError(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	execSQL(t, pool, "DROP TABLE sluice.assignments")
	_, err := s.Lookup(context.Background(), "c1")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" || !strings.HasPrefix(err.Error(), `postgres: lookup subject "c1": `) {
		t.Errorf("Lookup on a dropped table: %v, want the undefined_table error, wrapped", err)
	}
}

// TestLookupBadRows stores, by hand, plan rows that are not valid plans:
// Lookup (and Plan) must say which plan, which version and which field,
// and never panic.
func TestLookupBadRows(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	good := `{"capacity":10,"refill_tokens":10,"refill_period":"1s","refill":"Greedy"}`
	tests := []struct {
		name       string
		algorithm  string
		bandwidths string
		wantField  string
	}{
		{"negative_capacity", "TokenBucket", `[{"capacity":-5,"refill_tokens":10,"refill_period":"1s","refill":"Greedy"}]`, "Bandwidths[0].Capacity"},
		{"zero_period", "TokenBucket", `[{"capacity":10,"refill_tokens":10,"refill_period":"0s","refill":"Greedy"}]`, "Bandwidths[0].RefillPeriod"},
		{"unknown_algorithm", "Magic", `[` + good + `]`, `Algorithm "Magic" is not a known Algorithm`},
		{"empty_algorithm", "", `[` + good + `]`, `Algorithm "" is not a known Algorithm`},
		{"object_not_array", "TokenBucket", good, "bandwidths: must be a JSON array, got an object"},
		{"string_capacity", "TokenBucket", `[{"capacity":"10","refill_tokens":10,"refill_period":"1s","refill":"Greedy"}]`, "bandwidths[0].capacity"},
		{"fractional_capacity", "TokenBucket", `[{"capacity":1.5,"refill_tokens":10,"refill_period":"1s","refill":"Greedy"}]`, "bandwidths[0].capacity"},
		{"huge_capacity", "TokenBucket", `[{"capacity":1e30,"refill_tokens":10,"refill_period":"1s","refill":"Greedy"}]`, "bandwidths[0].capacity"},
		{"missing_period", "TokenBucket", `[` + good + `,{"capacity":10,"refill_tokens":10,"refill":"Greedy"}]`, "bandwidths[1].refill_period"},
		{"bad_period", "TokenBucket", `[{"capacity":10,"refill_tokens":10,"refill_period":"soon","refill":"Greedy"}]`, "bandwidths[0].refill_period"},
		{"unknown_field", "TokenBucket", `[{"capacity":10,"refill_tokens":10,"refill_period":"1s","refill":"Greedy","burst":5}]`, `bandwidths[0]: unknown field "burst"`},
		{"null", "TokenBucket", `null`, "bandwidths: must be a JSON array, got null"},
		{"empty_array", "TokenBucket", `[]`, "Bandwidths must have 1 to"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			execSQL(t, pool, "INSERT INTO sluice.plans (name, algorithm, bandwidths) VALUES ($1, $2, $3::jsonb)", tt.name, tt.algorithm, tt.bandwidths)
			execSQL(t, pool, "INSERT INTO sluice.assignments (subject, plan) VALUES ($1, $1)", tt.name)
			version := queryInt(t, pool, "SELECT version FROM sluice.plans WHERE name = $1", tt.name)
			wantPlan := fmt.Sprintf("plan %q version %d", tt.name, version)

			a, err := s.Lookup(context.Background(), tt.name)
			if !errors.Is(err, plans.ErrInvalidPlan) {
				t.Fatalf("Lookup = %+v, %v; want an error wrapping plans.ErrInvalidPlan", a, err)
			}
			for _, want := range []string{fmt.Sprintf("postgres: lookup subject %q", tt.name), wantPlan, tt.wantField} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Lookup error %q does not contain %q", err, want)
				}
			}
			if _, err := s.Plan(context.Background(), tt.name); !errors.Is(err, plans.ErrInvalidPlan) || !strings.Contains(err.Error(), wantPlan) {
				t.Errorf("Plan error %v, want one wrapping plans.ErrInvalidPlan naming %s", err, wantPlan)
			}
		})
	}
}

// TestMalformedJSONRejected: JSON that does not parse cannot be stored at
// all, since bandwidths is jsonb.
func TestMalformedJSONRejected(t *testing.T) {
	t.Parallel()
	_, pool := newStore(t)
	_, err := pool.Exec(context.Background(), "INSERT INTO sluice.plans (name, algorithm, bandwidths) VALUES ('m', 'TokenBucket', $1::jsonb)", `[{"capacity":`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22P02" { // invalid_text_representation
		t.Fatalf("INSERT of malformed JSON: %v, want invalid_text_representation", err)
	}
}

// TestBadVersionRow: a version no trigger would write, stored with the
// triggers disabled, is an error, not a huge unsigned number.
func TestBadVersionRow(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	putPlan(t, s, proPlan())
	assign(t, s, "c1", "pro")
	execSQL(t, pool, "ALTER TABLE sluice.plans DISABLE TRIGGER USER")
	execSQL(t, pool, "UPDATE sluice.plans SET version = -3")
	_, err := s.Lookup(context.Background(), "c1")
	if !errors.Is(err, plans.ErrInvalidPlan) || !strings.Contains(err.Error(), `plan "pro" version -3: version is not positive`) {
		t.Errorf("Lookup of a plan at version -3: %v", err)
	}
	execSQL(t, pool, "ALTER TABLE sluice.assignments DISABLE TRIGGER USER")
	execSQL(t, pool, "UPDATE sluice.assignments SET version = 0")
	_, err = s.Lookup(context.Background(), "c1")
	if !errors.Is(err, plans.ErrInvalidPlan) || !strings.Contains(err.Error(), "assignment version 0 is not positive") {
		t.Errorf("Lookup of an assignment at version 0: %v", err)
	}
}

func TestPutPlan(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	first := putPlan(t, s, proPlan())
	revised := proPlan()
	revised.Version = 12345 // ignored
	revised.Algorithm = ratelimit.GCRA
	revised.Bandwidths = revised.Bandwidths[:1]
	second := putPlan(t, s, revised)
	if second.Version <= first.Version {
		t.Errorf("revision's version %d, want more than %d", second.Version, first.Version)
	}
	got, err := s.Plan(context.Background(), "pro")
	if err != nil || !reflect.DeepEqual(got, second) {
		t.Errorf("Plan = %+v, %v; want %+v", got, err, second)
	}
	if _, err := s.Plan(context.Background(), "nope"); !errors.Is(err, ErrUnknownPlan) {
		t.Errorf("Plan(nope): %v, want ErrUnknownPlan", err)
	}
}

// TestPutPlanInvalid: an invalid plan is an error naming the field, and
// the database is as it was: no row, no revision, no version drawn.
func TestPutPlanInvalid(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	stored := putPlan(t, s, proPlan())
	seq := func() int64 { return queryInt(t, pool, "SELECT last_value FROM sluice.version_seq") }
	before := seq()

	negative := proPlan()
	negative.Bandwidths[0].Capacity = -1
	unknownAlg := proPlan()
	unknownAlg.Algorithm = ratelimit.Algorithm(200)
	badRefill := proPlan()
	badRefill.Bandwidths[0].Refill = ratelimit.RefillKind(9)
	tests := []struct {
		name string
		p    plans.Plan
		want string
	}{
		{"negative capacity", negative, "Capacity"},
		{"unknown algorithm", unknownAlg, "Algorithm"},
		{"unknown refill", badRefill, "Refill"},
		{"no bandwidths", plans.Plan{Name: "pro"}, "andwidth"},
		{"empty name", func() plans.Plan { p := proPlan(); p.Name = ""; return p }(), "Name"},
		{"long name", func() plans.Plan { p := proPlan(); p.Name = strings.Repeat("n", plans.MaxNameLen+1); return p }(), "Name"},
	}
	for _, tt := range tests {
		_, err := s.PutPlan(context.Background(), tt.p)
		if !errors.Is(err, plans.ErrInvalidPlan) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("PutPlan(%s): %v; want an error wrapping plans.ErrInvalidPlan naming %s", tt.name, err, tt.want)
		}
	}
	if got, err := s.Plan(context.Background(), "pro"); err != nil || !reflect.DeepEqual(got, stored) {
		t.Errorf("Plan after invalid PutPlans = %+v, %v; want it unchanged, %+v", got, err, stored)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM sluice.plans"); n != 1 {
		t.Errorf("%d plans stored, want 1", n)
	}
	if after := seq(); after != before {
		t.Errorf("version sequence moved from %d to %d", before, after)
	}
}

func TestAssign(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	putPlan(t, s, proPlan())
	ctx := context.Background()

	if _, err := s.Assign(ctx, "c1", "gold"); !errors.Is(err, ErrUnknownPlan) || !strings.Contains(err.Error(), `"gold"`) {
		t.Errorf(`Assign to unknown plan "gold": %v, want ErrUnknownPlan naming it`, err)
	}
	if _, err := s.Assign(ctx, "c1", ""); err == nil || !strings.Contains(err.Error(), "Unassign") {
		t.Errorf("Assign to an empty plan: %v, want an error pointing at Unassign", err)
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxSubjectLen+1), "a\x00b", "\xff"} {
		if _, err := s.Assign(ctx, bad, "pro"); !errors.Is(err, ErrInvalidSubject) {
			t.Errorf("Assign(%.20q): %v, want ErrInvalidSubject", bad, err)
		}
		if _, err := s.Unassign(ctx, bad); !errors.Is(err, ErrInvalidSubject) {
			t.Errorf("Unassign(%.20q): %v, want ErrInvalidSubject", bad, err)
		}
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM sluice.assignments"); n != 0 {
		t.Errorf("%d assignments stored after failed calls, want 0", n)
	}

	longest := strings.Repeat("ü", MaxSubjectLen/2)
	v1 := assign(t, s, longest, "pro")
	v2 := assign(t, s, longest, "pro")
	if v2 <= v1 {
		t.Errorf("reassigning: version %d after %d", v2, v1)
	}
	v3, err := s.Unassign(ctx, "never-assigned")
	if err != nil || v3 <= v2 {
		t.Fatalf("Unassign(never-assigned) = %d, %v; want a version above %d", v3, err, v2)
	}
	if got := lookup(t, s, "never-assigned"); got.Version != v3 || got.Plan.Name != "" {
		t.Errorf("Lookup after Unassign = %+v, want version %d and no plan", got, v3)
	}
}
