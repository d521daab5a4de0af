package testkit

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/sluicehq/sluice/internal/test/servers"
)

// stopTimeout bounds the removal of the shared PostgreSQL container.
const stopTimeout = time.Minute

// Database is a PostgreSQL database of one test, from [Postgres].
type Database struct {
	db *servers.PGDatabase
}

// Name returns the database's name: "sluice_", a form of the test's name
// and a random suffix.
func (d *Database) Name() string { return d.db.Name() }

// ConnString returns a postgres:// URL of the database, for a user that
// owns it.
func (d *Database) ConnString() string { return d.db.ConnString() }

// Pool returns a new pool of connections to the database, which t.Cleanup
// closes.
func (d *Database) Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return d.db.Pool(t)
}

// shared is the PostgreSQL container that [Postgres] shares among the
// tests of a test binary, started by the first.
var shared struct {
	mu          sync.Mutex
	c           *tcpostgres.PostgresContainer
	maintenance string // a postgres:// URL for CREATE DATABASE
}

// Postgres returns a new, empty database for the test, made by CREATE
// DATABASE on a server the test binary's tests share, and dropped by
// t.Cleanup (WITH (FORCE), after the cleanups the test registers later,
// such as a [Database.Pool]'s).
//
// In containers the server is one of [DefaultPostgresImage] (or
// $SLUICE_POSTGRES_IMAGE's), started by the first call; [Main] removes it
// when the tests end. As binaries it is the first of: the server
// $SLUICE_POSTGRES_URL names (a URL of a database to connect to, as a user
// allowed to create databases), the machine's on 127.0.0.1:5432 as user
// postgres when it answers, and a throwaway cluster of the test's own.
func Postgres(t testing.TB) *Database {
	t.Helper()
	if ModeOf(t) == Binaries {
		return &Database{db: servers.Postgres(t)}
	}
	return &Database{db: servers.CreateDatabase(t, sharedPostgres(t))}
}

// sharedPostgres returns the maintenance URL of the shared container,
// starting it if no test has.
func sharedPostgres(t testing.TB) string {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		return shared.maintenance
	}
	ctx, cancel := startContext(t)
	defer cancel()
	c, err := tcpostgres.Run(ctx, image(EnvPostgresImage, DefaultPostgresImage),
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		t.Fatalf("testkit: start PostgreSQL container: %v", err)
	}
	url, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		t.Fatalf("testkit: PostgreSQL container's URL: %v", err)
	}
	shared.c, shared.maintenance = c, url
	return url
}

// M is what TestMain hands [Main]: a *testing.M, or a wrapper of one.
type M interface {
	Run() int
}

// Main returns m, whose Run also removes the PostgreSQL container that
// [Postgres] shared once m's tests have run. Use it in TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testkit.Main(m).Run()) }
//
// or around the testing.M that goleak.VerifyTestMain takes.
func Main(m M) M { return mainM{m} }

type mainM struct{ m M }

func (mm mainM) Run() int {
	code := mm.m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := shared.c.Terminate(ctx); err != nil && code == 0 {
			fmt.Fprintln(os.Stderr, "testkit: remove the shared PostgreSQL container:", err)
			code = 1
		}
		shared.c = nil
	}
	return code
}
