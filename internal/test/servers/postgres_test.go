package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestChoosePostgres(t *testing.T) {
	errRefused := errors.New("connection refused")
	errNoBin := errors.New("initdb not found")
	tests := []struct {
		name       string
		env        string
		probeErr   error
		binErr     error
		want       pgSource
		wantProbed bool
		wantErr    bool
	}{
		{name: "env wins without a probe", env: "postgres://db.example/x", probeErr: errRefused, binErr: errNoBin, want: fromEnv},
		{name: "machine server answers", wantProbed: true, want: fromMachine},
		{name: "machine server without binaries", binErr: errNoBin, wantProbed: true, want: fromMachine},
		{name: "no server, binaries", probeErr: errRefused, wantProbed: true, want: fromCluster},
		{name: "nothing", probeErr: errRefused, binErr: errNoBin, wantProbed: true, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			probed := false
			probe := func() error { probed = true; return tt.probeErr }
			got, err := choosePostgres(tt.env, probe, tt.binErr)
			if probed != tt.wantProbed {
				t.Errorf("probed = %v, want %v", probed, tt.wantProbed)
			}
			if tt.wantErr {
				if err == nil {
					t.Fatalf("choosePostgres = %v, want an error", got)
				}
				for _, want := range []string{"127.0.0.1:5432", errRefused.Error(), envPostgresURL, errNoBin.Error()} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not mention %q", err, want)
					}
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("choosePostgres = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// endTB records how a test would have ended without ending the real one;
// like testing.T, Fatal and Skip stop the calling goroutine.
type endTB struct {
	testing.TB
	outcome string
}

func (tb *endTB) Helper()      {}
func (tb *endTB) Fatal(...any) { tb.end("failed") }
func (tb *endTB) Skip(...any)  { tb.end("skipped") }
func (tb *endTB) end(o string) { tb.outcome = o; runtime.Goexit() }

// run runs f on a goroutine of its own, as a test body runs.
func (tb *endTB) run(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
		tb.outcome = "returned"
	}()
	<-done
}

func TestSkipOrFail(t *testing.T) {
	for _, tt := range []struct{ ci, want string }{{"", "skipped"}, {"true", "failed"}} {
		t.Run("CI="+tt.ci, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			tb := &endTB{TB: t}
			tb.run(func() { skipOrFail(tb, "no server") })
			if tb.outcome != tt.want {
				t.Errorf("outcome = %s, want %s", tb.outcome, tt.want)
			}
		})
	}
}

func TestFindPostgres(t *testing.T) {
	t.Run("found", func(t *testing.T) {
		dir := RequirePostgres(t)
		for _, bin := range []string{"initdb", "postgres"} {
			if !isFile(filepath.Join(dir, bin)) {
				t.Errorf("RequirePostgres = %s, which has no %s", dir, bin)
			}
		}
	})
	t.Run("missing", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		dir, err := findPostgres(filepath.Join(t.TempDir(), "*", "bin"))
		if err == nil {
			t.Fatalf("findPostgres = %s with an empty PATH and no Debian directories", dir)
		}
		if !strings.Contains(err.Error(), "apt-get install postgresql") {
			t.Errorf("error %q does not say how to install PostgreSQL", err)
		}
	})
}

// TestPostgres gets a database as a test does without $SLUICE_POSTGRES_URL:
// on the machine's server if it answers, else on a cluster of its own.
func TestPostgres(t *testing.T) {
	t.Setenv(envPostgresURL, "")
	db := Postgres(t)
	var name string
	if err := db.Pool(t).QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil || name != db.Name() {
		t.Fatalf("current_database() = %q, %v; want %q", name, err, db.Name())
	}
}

func TestDatabaseName(t *testing.T) {
	valid := regexp.MustCompile(`^sluice_[a-z0-9_]+_[0-9a-f]{8}$`)
	for _, test := range []string{"TestX", "TestLookup/unknown_subject#01", strings.Repeat("TestLong", 20), "Ünïcode/名前"} {
		name := databaseName(test)
		if !valid.MatchString(name) || len(name) > 63 {
			t.Errorf("databaseName(%q) = %q: want %s, at most 63 bytes", test, name, valid)
		}
		if again := databaseName(test); again == name {
			t.Errorf("databaseName(%q) returned %q twice", test, name)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	got, err := withDatabase("postgres://u:p@h:5433/maint?sslmode=disable", "sluice_x")
	if want := "postgres://u:p@h:5433/sluice_x?sslmode=disable"; err != nil || got != want {
		t.Errorf("withDatabase = %q, %v; want %q", got, err, want)
	}
	if _, err := withDatabase("host=h dbname=maint", "sluice_x"); err == nil {
		t.Error("withDatabase accepted a keyword/value connection string")
	}
}

// connect opens a connection that t.Cleanup closes.
func connect(t *testing.T, connString string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatalf("connect %s: %v", connString, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// show returns a server setting.
func show(t *testing.T, conn *pgx.Conn, setting string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(context.Background(), "SHOW "+setting).Scan(&v); err != nil {
		t.Fatalf("SHOW %s: %v", setting, err)
	}
	return v
}

func TestStartPostgres(t *testing.T) {
	t.Parallel()
	s := StartPostgres(t)
	conn := connect(t, s.ConnString("postgres"))
	if got := show(t, conn, "fsync"); got != "off" {
		t.Errorf("fsync = %s, want off", got)
	}
	if got := show(t, conn, "listen_addresses"); got != "127.0.0.1" {
		t.Errorf("listen_addresses = %s, want 127.0.0.1", got)
	}
	if got := show(t, conn, "shared_preload_libraries"); got != s.preload {
		t.Errorf("shared_preload_libraries = %q, want %q", got, s.preload)
	}
	if s.preload != "" {
		if _, err := conn.Exec(context.Background(), "CREATE EXTENSION pg_stat_statements"); err != nil {
			t.Errorf("CREATE EXTENSION pg_stat_statements: %v", err)
		}
	}

	db := s.NewDatabase(t)
	dbConn := connect(t, db.ConnString())
	var name string
	if err := dbConn.QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil || name != db.Name() {
		t.Fatalf("current_database() = %q, %v; want %q", name, err, db.Name())
	}
	if _, err := dbConn.Exec(context.Background(), "CREATE TABLE t (x int)"); err != nil {
		t.Fatalf("CREATE TABLE in the new database: %v", err)
	}
}

func TestPostgresStopStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartPostgres(t)
	addr := s.Addr()
	db := s.NewDatabase(t)
	before := connect(t, db.ConnString())
	if _, err := before.Exec(ctx, "CREATE TABLE t AS SELECT 42 AS x"); err != nil {
		t.Fatalf("CREATE TABLE: %v", err)
	}

	s.Stop(t)
	if err := before.Ping(ctx); err == nil {
		t.Error("a connection from before Stop still answers")
	}
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after Stop: %v, want connection refused", err)
	}
	s.Stop(t) // stopping a stopped server does nothing

	s.Start(t)
	if s.Addr() != addr {
		t.Fatalf("Addr after Start = %s, want %s", s.Addr(), addr)
	}
	var x int
	if err := connect(t, db.ConnString()).QueryRow(ctx, "SELECT x FROM t").Scan(&x); err != nil || x != 42 {
		t.Fatalf("SELECT after Start = %d, %v; want the 42 written before Stop", x, err)
	}
}

// TestPostgresDrops runs Postgres against a shared server, made one by
// pointing $SLUICE_POSTGRES_URL at a cluster of the test's own, and checks
// that the database is gone once the test that made it ends, connections
// left open notwithstanding.
func TestPostgresDrops(t *testing.T) {
	s := StartPostgres(t)
	t.Setenv(envPostgresURL, s.ConnString("postgres"))
	outer := t
	var name string
	t.Run("uses", func(t *testing.T) {
		db := Postgres(t)
		name = db.Name()
		if want := fmt.Sprintf("/%s?", name); !strings.Contains(db.ConnString(), s.Addr()+want) {
			t.Errorf("ConnString = %s, want the database on %s", db.ConnString(), s.Addr())
		}
		pool := db.Pool(t)
		if err := pool.Ping(context.Background()); err != nil {
			t.Fatalf("ping %s: %v", name, err)
		}
		connect(outer, db.ConnString()) // closed only after the drop
	})
	var exists bool
	err := connect(t, s.ConnString("postgres")).QueryRow(context.Background(),
		"SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil || exists {
		t.Fatalf("database %s exists after its test = %v, %v; want false", name, exists, err)
	}
}
