package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestWritersSerialised: while a transaction that wrote a plan or an
// assignment is open, the store's writes wait for it, whatever it wrote,
// and then take versions above the open one's. Reads do not wait.
func TestWritersSerialised(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	putOther := func(s *Store) error {
		p := proPlan()
		p.Name = "other"
		_, err := s.PutPlan(ctx, p)
		return err
	}
	assignC2 := func(s *Store) error { _, err := s.Assign(ctx, "c2", "pro"); return err }
	tests := []struct {
		name  string
		open  string // the open transaction's statement
		write func(*Store) error
	}{
		{"plan update/PutPlan", `UPDATE sluice.plans SET algorithm = 'GCRA' WHERE name = 'pro'`, putOther},
		{"plan update/Assign", `UPDATE sluice.plans SET algorithm = 'GCRA' WHERE name = 'pro'`, assignC2},
		{"plan insert/Assign", `INSERT INTO sluice.plans (name, algorithm, bandwidths) VALUES ('new', 'GCRA', '[]')`, assignC2},
		{"plan delete/PutPlan", `DELETE FROM sluice.plans WHERE name = 'spare'`, putOther},
		{"assignment update/PutPlan", `UPDATE sluice.assignments SET plan = 'spare' WHERE subject = 'c1'`, putOther},
		{"assignment delete/Assign", `DELETE FROM sluice.assignments WHERE subject = 'c1'`, assignC2},
		{"write of no row/PutPlan", `UPDATE sluice.plans SET algorithm = 'GCRA' WHERE false`, putOther},
		{"lock_versions/Assign", `SELECT sluice.lock_versions()`, assignC2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, pool := newStore(t)
			putPlan(t, s, proPlan())
			spare := proPlan()
			spare.Name = "spare"
			putPlan(t, s, spare)
			assign(t, s, "c1", "pro")

			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, tt.open); err != nil {
				t.Fatal(err)
			}
			openTop := queryInt(t, pool, "SELECT last_value FROM sluice.version_seq")
			done := make(chan error, 1)
			go func() { done <- tt.write(s) }()
			if servers.ReturnedOrWaiting(t, pool, done) {
				t.Fatalf("the write returned (%v) while a transaction that wrote was open", <-done)
			}
			if got := lookup(t, s, "c1"); got.Plan.Name != "pro" {
				t.Errorf("Lookup during the open write = %+v, want c1 on pro as committed", got)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("the write, after the commit: %v", err)
			}
			var least int64
			if err := pool.QueryRow(ctx, `SELECT min(version) FROM (
SELECT version FROM sluice.plans WHERE name = 'other' UNION ALL
SELECT version FROM sluice.assignments WHERE subject = 'c2') v`).Scan(&least); err != nil {
				t.Fatal(err)
			}
			if least <= openTop {
				t.Errorf("the write drew version %d, not above %d, which the open transaction's statement left", least, openTop)
			}
		})
	}
}

// Sizes of TestVersionsCommitOrder.
const (
	orderWriters      = 6
	orderTransactions = 40 // each writer's
	orderReaders      = 3
	orderPlans        = 4
	orderSubjects     = 8
)

// observation is what one Lookup found: a subject's config version and
// the config it names.
type observation struct {
	subject string
	version uint64
	config  string
}

func (o observation) String() string {
	return fmt.Sprintf("%s at version %d: %s", o.subject, o.version, o.config)
}

// observations are what TestVersionsCommitOrder's readers found.
type observations struct {
	mu        sync.Mutex
	named     map[uint64]observation // config version to the first lookup that found it
	conflicts []string
	regressed []string
	errs      []string
	lookups   int

	// passes counts the readers' passes over every subject, for writers
	// that wait for them (see waitPasses).
	passes int
	passed *sync.Cond // on mu
}

func newObservations() *observations {
	o := &observations{named: map[uint64]observation{}}
	o.passed = sync.NewCond(&o.mu)
	return o
}

// read looks every subject up once with s, checking each lookup against
// the others and against what this reader found before (last), and counts
// the pass.
func (o *observations) read(ctx context.Context, s *Store, last map[string]observation) {
	for i := range orderSubjects {
		a, err := s.Lookup(ctx, subjectName(i))
		o.mu.Lock()
		o.lookups++
		if err != nil {
			o.errs = append(o.errs, err.Error())
			o.mu.Unlock()
			continue
		}
		got := observation{a.Subject, a.ConfigVersion(), describe(a.Plan)}
		if first, ok := o.named[got.version]; !ok {
			o.named[got.version] = got
		} else if first.config != got.config {
			o.conflicts = append(o.conflicts, fmt.Sprintf("%v, and %v", first, got))
		}
		if prev, ok := last[got.subject]; ok && got.version < prev.version {
			o.regressed = append(o.regressed, fmt.Sprintf("%v, then %v", prev, got))
		}
		o.mu.Unlock()
		last[got.subject] = got
	}
	o.mu.Lock()
	o.passes++
	o.mu.Unlock()
	o.passed.Broadcast()
}

// describe is p's name and limits, as the store holds them.
func describe(p plans.Plan) string {
	bw, err := plans.MarshalBandwidths(p.Bandwidths)
	if err != nil {
		return fmt.Sprintf("%s: %v", p.Name, err)
	}
	return fmt.Sprintf("%s %v %s", p.Name, p.Algorithm, bw)
}

// waitPasses returns once the readers have made two more passes: at least
// one pass began after the call.
func (o *observations) waitPasses() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for want := o.passes + 2; o.passes < want; {
		o.passed.Wait()
	}
}

// TestVersionsCommitOrder has writers change plans and assignments at
// once, in transactions of one to three statements, some rolled back,
// with hand-written SQL and the store's calls, while readers look the
// subjects up. A transaction waits, after its writes and before its end,
// for the readers to look at every subject: were versions drawn in
// statement order, other writers would commit above its versions
// meanwhile, and the readers would see it. Whatever the interleaving:
//   - no two lookups find one config version naming two configs;
//   - no reader sees a subject's config version go back;
//   - a listener receives versions in increasing order;
//   - no writer deadlocks.
func TestVersionsCommitOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := servers.Postgres(t)
	pool := db.Pool(t)
	s := migrated(t, pool)
	// The readers are another replica, with a pool of their own: the
	// writers may hold every connection of theirs.
	replica, err := New(db.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	conn := listenRaw(t, pool, "sluice_changes")
	for i := range orderPlans {
		setPlan(t, s, i, 1)
	}
	for i := range orderSubjects {
		assign(t, s, subjectName(i), planName(i%orderPlans))
	}

	seen := newObservations()
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range orderReaders {
		readers.Go(func() {
			last := map[string]observation{}
			for {
				select {
				case <-stop:
					return
				default:
					seen.read(ctx, replica, last)
				}
			}
		})
	}

	var (
		mu                               sync.Mutex
		committed, rolledBack, deadlocks int
		writers                          sync.WaitGroup
	)
	for w := range orderWriters {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 28))
			for range orderTransactions {
				err := writeRandomly(ctx, s, pool, rng, seen.waitPasses)
				mu.Lock()
				var pgErr *pgconn.PgError
				switch {
				case err == nil:
					committed++
				case errors.Is(err, errRolledBack):
					rolledBack++
				case errors.As(err, &pgErr) && pgErr.Code == "40P01":
					deadlocks++
				default:
					t.Errorf("writer %d: %v", w, err)
				}
				mu.Unlock()
			}
		})
	}
	writers.Wait()
	close(stop)
	readers.Wait()

	// The last write marks the end of the notifications.
	end := putPlan(t, s, plans.Plan{Name: "end", Bandwidths: proPlan().Bandwidths})
	var (
		last       uint64
		received   int
		disordered []string
	)
	for {
		payload := next(t, conn)
		c, err := parsePayload(payload)
		if err != nil {
			t.Fatalf("payload %q: %v", payload, err)
		}
		received++
		if c.Version < last {
			disordered = append(disordered, fmt.Sprintf("%q after version %d", payload, last))
		}
		last = c.Version
		if c.ID == end.Name {
			break
		}
	}

	t.Logf("%d transactions committed, %d rolled back, %d deadlocked; %d lookups in %d passes found %d config versions; %d notifications",
		committed, rolledBack, deadlocks, seen.lookups, seen.passes, len(seen.named), received)
	failures(t, "Lookup failed", seen.errs)
	failures(t, "one config version names two configs", seen.conflicts)
	failures(t, "a reader saw a config version go back", seen.regressed)
	failures(t, "a listener received versions out of order", disordered)
	if deadlocks > 0 {
		t.Errorf("%d writers deadlocked, want none: writers wait for one another on the version lock, never on rows", deadlocks)
	}
	if committed == 0 || len(seen.named) < 2 {
		t.Errorf("%d transactions committed and %d config versions seen: the test tested nothing", committed, len(seen.named))
	}
}

// failures fails t with how many examples it found of what, and the first
// few.
func failures(t testing.TB, what string, examples []string) {
	t.Helper()
	if len(examples) > 0 {
		t.Errorf("%s, %d times; the first: %s", what, len(examples), strings.Join(examples[:min(3, len(examples))], "; "))
	}
}

func planName(i int) string    { return "p" + strconv.Itoa(i) }
func subjectName(i int) string { return "s" + strconv.Itoa(i) }

// setPlan puts plan i with a capacity of capacity a minute, through the
// store.
func setPlan(t testing.TB, s *Store, i int, capacity int64) {
	t.Helper()
	putPlan(t, s, plans.Plan{Name: planName(i), Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(capacity)}})
}

// errRolledBack is what writeRandomly returns for a transaction it rolled
// back on purpose.
var errRolledBack = errors.New("rolled back")

// writeRandomly runs one writer's transaction: one to three writes of a
// plan's limits or a subject's assignment, by hand-written SQL in a
// transaction that calls hold after its writes and then commits, or one
// time in eight rolls back; or one write through the store's own calls.
func writeRandomly(ctx context.Context, s *Store, pool *pgxpool.Pool, rng *rand.Rand, hold func()) error {
	if rng.IntN(4) == 0 {
		if rng.IntN(2) == 0 {
			_, err := s.Assign(ctx, subjectName(rng.IntN(orderSubjects)), planName(rng.IntN(orderPlans)))
			return err
		}
		p := plans.Plan{Name: planName(rng.IntN(orderPlans)), Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(1 + rng.Int64N(1000))}}
		_, err := s.PutPlan(ctx, p)
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // after a commit, a no-op
	for range 1 + rng.IntN(3) {
		if err := writeOne(ctx, tx, rng); err != nil {
			return err
		}
	}
	hold()
	if rng.IntN(8) == 0 {
		if err := tx.Rollback(ctx); err != nil {
			return err
		}
		return errRolledBack
	}
	return tx.Commit(ctx)
}

// writeOne is one hand-written write: a plan's limits, or a subject's
// plan.
func writeOne(ctx context.Context, tx pgx.Tx, rng *rand.Rand) error {
	if rng.IntN(2) == 0 {
		_, err := tx.Exec(ctx, "UPDATE sluice.assignments SET plan = $1 WHERE subject = $2",
			planName(rng.IntN(orderPlans)), subjectName(rng.IntN(orderSubjects)))
		return err
	}
	bw, err := plans.MarshalBandwidths([]ratelimit.Bandwidth{ratelimit.PerMinute(1 + rng.Int64N(1000))})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "UPDATE sluice.plans SET bandwidths = $1 WHERE name = $2", bw, planName(rng.IntN(orderPlans)))
	return err
}
