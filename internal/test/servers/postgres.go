package servers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice/internal/test/harness"
)

// envPostgresURL names the variable that points [Postgres] at an existing
// server.
const envPostgresURL = "SLUICE_POSTGRES_URL"

// machinePostgresURL is the server a developer machine or CI runner may
// have running: Debian's postgresql package starts one on port 5432 with
// trust authentication for local connections.
const machinePostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

const (
	// pgProbeTimeout bounds the check that the machine's server answers; a
	// refused connection returns at once, so only a hung server waits.
	pgProbeTimeout = 2 * time.Second
	// pgReadyTimeout bounds the wait for a started cluster's first answer:
	// it replays no WAL after a fast shutdown, but CI machines stall.
	pgReadyTimeout = 30 * time.Second
	// pgStopTimeout bounds a fast shutdown, which with fsync=off writes a
	// checkpoint of a few pages.
	pgStopTimeout = 30 * time.Second
	// pgKillGrace is how long the cleanup's immediate shutdown may take
	// before the postmaster is killed outright.
	pgKillGrace = 5 * time.Second
	// pgUser is the superuser of a cluster from [StartPostgres], and the OS
	// user it runs as when the tests run as root: initdb and postgres
	// refuse to run as root.
	pgUser = "postgres"
	// pgDebianDirs is where Debian's postgresql packages keep the server
	// binaries, one bin directory per major version, off PATH.
	pgDebianDirs = "/usr/lib/postgresql/*/bin"
)

// pgSource is where [Postgres] makes a test's database.
type pgSource int

const (
	// fromEnv is the server $SLUICE_POSTGRES_URL names.
	fromEnv pgSource = iota + 1
	// fromMachine is the machine's server on 127.0.0.1:5432.
	fromMachine
	// fromCluster is a throwaway cluster of the test's own.
	fromCluster
)

// choosePostgres picks where [Postgres] makes a database: the server env
// (the value of $SLUICE_POSTGRES_URL) names when it is set; else the
// machine's server when probe, called only then, says it answers; else a
// cluster of the test's own when the binaries were found (binErr is nil).
// With none of them it returns an error that says how to get one.
func choosePostgres(env string, probe func() error, binErr error) (pgSource, error) {
	if env != "" {
		return fromEnv, nil
	}
	probeErr := probe()
	switch {
	case probeErr == nil:
		return fromMachine, nil
	case binErr == nil:
		return fromCluster, nil
	}
	return 0, fmt.Errorf("no PostgreSQL server answers on 127.0.0.1:5432 (%v), $%s is not set, and %w",
		probeErr, envPostgresURL, binErr)
}

// skipOrFail ends a test that cannot get the server it needs: it skips
// the test, unless $CI is set, since CI must run every test, so there it
// fails the test instead.
func skipOrFail(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// RequirePostgres returns the directory that holds PostgreSQL's initdb
// and postgres: that of initdb on PATH, else the newest of Debian's
// /usr/lib/postgresql/<version>/bin. Without one it skips the test, unless
// $CI is set: there it fails the test instead.
func RequirePostgres(t testing.TB) string {
	t.Helper()
	dir, err := findPostgres(pgDebianDirs)
	if err != nil {
		skipOrFail(t, "servers: "+err.Error())
	}
	return dir
}

// findPostgres is RequirePostgres's search, with debianDirs the glob
// pattern of Debian's directories. It resolves symbolic links, since
// initdb and postgres are found beside each other in the real directory.
func findPostgres(debianDirs string) (string, error) {
	var dirs []string
	if path, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(path); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
	}
	debian, err := filepath.Glob(debianDirs)
	if err != nil {
		return "", fmt.Errorf("look for PostgreSQL in %s: %w", debianDirs, err)
	}
	slices.SortFunc(debian, func(a, b string) int { return pgMajor(b) - pgMajor(a) })
	for _, dir := range append(dirs, debian...) {
		if isFile(filepath.Join(dir, "initdb")) && isFile(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", errors.New("PostgreSQL's initdb and postgres not found on PATH or in " + debianDirs +
		"; .ci/run installs them (apt-get install postgresql)")
}

// pgMajor is the major version in a path /usr/lib/postgresql/<major>/bin,
// or 0.
func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isFile(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular()
}

// PGDatabase is a database of its own for one test, from [Postgres] or
// [PGServer.NewDatabase].
type PGDatabase struct {
	name       string
	connString string
}

// Name returns the database's name: "sluice_", a form of the test's name
// and a random suffix, all lower-case letters, digits and underscores.
func (d *PGDatabase) Name() string { return d.name }

// ConnString returns a postgres:// URL of the database for a superuser (or
// for the user $SLUICE_POSTGRES_URL names).
func (d *PGDatabase) ConnString() string { return d.connString }

// PoolConfig returns a pool config for ConnString, for a test to adjust
// before it calls pgxpool.NewWithConfig.
func (d *PGDatabase) PoolConfig(t testing.TB) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.connString)
	if err != nil {
		t.Fatalf("servers: parse %s: %v", d.connString, err)
	}
	return cfg
}

// Pool returns a new pool of connections to the database, which t.Cleanup
// closes.
func (d *PGDatabase) Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), d.PoolConfig(t))
	if err != nil {
		t.Fatalf("servers: pool for database %s: %v", d.name, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Postgres returns a new, empty database for the test, made by CREATE
// DATABASE on the first server of:
//
//   - the one $SLUICE_POSTGRES_URL names, a postgres:// URL of a database
//     to connect to for CREATE DATABASE, as a user allowed to create
//     databases;
//   - the machine's server on 127.0.0.1:5432, as user postgres, when it
//     answers;
//   - a throwaway cluster of the test's own, from [StartPostgres].
//
// On a shared server t.Cleanup drops the database (WITH (FORCE), so
// connections a test leaves open do not keep it), after the cleanups the
// test registered later, such as a [PGDatabase.Pool]'s. Without any server
// it skips the test, unless $CI is set: there it fails the test instead.
func Postgres(t testing.TB) *PGDatabase {
	t.Helper()
	binDir, binErr := findPostgres(pgDebianDirs)
	src, err := choosePostgres(os.Getenv(envPostgresURL), probeMachinePostgres, binErr)
	switch {
	case err != nil:
		skipOrFail(t, "servers: "+err.Error())
	case src == fromCluster:
		return startPostgres(t, binDir).NewDatabase(t)
	case src == fromEnv:
		return createDatabase(t, os.Getenv(envPostgresURL), true)
	}
	return createDatabase(t, machinePostgresURL, true)
}

// probeMachinePostgres reports whether the machine's server answers.
func probeMachinePostgres() error {
	ctx, cancel := context.WithTimeout(context.Background(), pgProbeTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, machinePostgresURL)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// CreateDatabase creates a database for t on the server that maintenance
// (a postgres:// URL of a database to connect to for CREATE DATABASE, as a
// user allowed to create databases) reaches, as [Postgres] does on a shared
// server, and drops it in t.Cleanup. The test kit's containers use it.
func CreateDatabase(t testing.TB, maintenance string) *PGDatabase {
	t.Helper()
	return createDatabase(t, maintenance, true)
}

// createDatabase creates a database for t on the server that maintenance
// (a postgres:// URL) connects to, and drops it in t.Cleanup when drop is
// set.
func createDatabase(t testing.TB, maintenance string, drop bool) *PGDatabase {
	t.Helper()
	name := databaseName(t.Name())
	connString, err := withDatabase(maintenance, name)
	if err != nil {
		t.Fatalf("servers: %v", err)
	}
	if err := execOn(maintenance, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("servers: create database %s: %v", name, err)
	}
	if drop {
		t.Cleanup(func() {
			if err := execOn(maintenance, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
				t.Errorf("servers: drop database %s: %v", name, err)
			}
		})
	}
	return &PGDatabase{name: name, connString: connString}
}

// databaseName is a database name unique to one call: "sluice_", the
// test's name in the characters that need no quoting, and a random suffix,
// within PostgreSQL's 63-byte limit.
func databaseName(test string) string {
	const maxSlug = 40
	slug := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '_'
	}, test)
	if len(slug) > maxSlug {
		slug = slug[:maxSlug]
	}
	return fmt.Sprintf("sluice_%s_%08x", slug, rand.Uint32())
}

// withDatabase returns the postgres:// URL connString with its database
// replaced by name.
func withDatabase(connString, name string) (string, error) {
	u, err := url.Parse(connString)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%q is not a postgres:// URL", connString)
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// execOn runs sql on a connection of its own to connString.
func execOn(connString, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), pgReadyTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, sql)
	return errors.Join(err, conn.Close(ctx))
}

// PGServer is a throwaway PostgreSQL cluster from [StartPostgres].
type PGServer struct {
	bin  string              // directory of initdb and postgres
	dir  string              // holds data/ and the log
	cred *syscall.Credential // the OS user to run as; nil for the current one
	port int
	// preload is the shared_preload_libraries setting.
	preload string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been reaped
}

// StartPostgres initializes a throwaway PostgreSQL cluster and starts it
// on a free 127.0.0.1 port, waiting until it accepts connections. It
// trusts every local connection (superuser postgres), skips fsync, and
// preloads pg_stat_statements when the installation has it. Its data
// directory and log live in a directory of its own under os.TempDir(),
// not t.TempDir(), whose parents only the test's user may enter and whose
// long paths overflow a Unix socket address. When the tests run as root,
// the cluster runs as the OS user postgres, since initdb and postgres
// refuse to run as root.
//
// The postmaster is a child of the test binary rather than a daemon that
// pg_ctl detaches, so the kernel kills it if the test binary dies without
// its cleanups, and [PGServer.Stop] knows when it has exited. t.Cleanup
// shuts it down at once (an immediate shutdown, then SIGKILL), removes its
// directory and, if the test failed, logs the tail of its log. Without the
// binaries ([RequirePostgres]) it skips the test, or fails it in CI.
func StartPostgres(t testing.TB) *PGServer {
	t.Helper()
	return startPostgres(t, RequirePostgres(t))
}

func startPostgres(t testing.TB, binDir string) *PGServer {
	t.Helper()
	s := &PGServer{bin: binDir, preload: statStatements(binDir)}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("servers: postgres %s log tail:\n%s", s.Addr(), s.logTail(0))
		}
		if err := os.RemoveAll(s.dir); err != nil {
			t.Errorf("servers: remove postgres cluster directory: %v", err)
		}
	})
	if err := s.makeDir(); err != nil {
		t.Fatalf("servers: postgres cluster directory: %v", err)
	}
	if err := s.initdb(); err != nil {
		t.Fatalf("servers: initdb: %v; log:\n%s", err, s.logTail(0))
	}
	for attempt := 1; ; attempt++ {
		s.port = FreePorts(t, 1)[0]
		err := s.launch()
		if err == nil {
			return s
		}
		if !errors.Is(err, errPortInUse) || attempt == startAttempts {
			t.Fatalf("servers: start postgres (attempt %d): %v", attempt, err)
		}
	}
}

// statStatements returns "pg_stat_statements" when the installation in
// binDir has that module, else "".
func statStatements(binDir string) string {
	out, err := exec.Command(filepath.Join(binDir, "pg_config"), "--pkglibdir").Output()
	if err != nil || !isFile(filepath.Join(strings.TrimSpace(string(out)), "pg_stat_statements.so")) {
		return ""
	}
	return "pg_stat_statements"
}

// makeDir creates the cluster's directory, owned by the user it runs as.
func (s *PGServer) makeDir() error {
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		return err
	}
	s.dir = dir
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(pgUser)
	if err != nil {
		return fmt.Errorf("running as root, so the cluster must run as user %s: %w", pgUser, err)
	}
	uid, errU := strconv.ParseUint(u.Uid, 10, 32)
	gid, errG := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(errU, errG); err != nil {
		return fmt.Errorf("user %s: %w", pgUser, err)
	}
	s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	return os.Chown(dir, int(uid), int(gid))
}

func (s *PGServer) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *PGServer) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// initdb creates the cluster, logging to the server's log.
func (s *PGServer) initdb() error {
	return s.run(exec.Command(filepath.Join(s.bin, "initdb"),
		"--pgdata", s.dataDir(),
		"--username", pgUser,
		"--auth", "trust",
		"--encoding", "UTF8",
		"--locale", "C",
		"--no-sync", // the cluster is thrown away; durability buys nothing
	), func(cmd *exec.Cmd) error { return cmd.Run() })
}

// run runs cmd as the cluster's user, in its directory, with output
// appended to its log, by calling do.
func (s *PGServer) run(cmd *exec.Cmd, do func(*exec.Cmd) error) error {
	out, err := os.OpenFile(s.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close() // the child has its own descriptor
	// Files rather than pipes, so no goroutines copy output.
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = s.dir // the test's directory may be closed to the cluster's user
	cmd.SysProcAttr = harness.SysProcAttr()
	if s.cred != nil {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Credential = s.cred
	}
	return do(cmd)
}

// argv is the postmaster's command line: its settings go there, not in
// postgresql.conf, so that the port can differ between launches.
func (s *PGServer) argv() []string {
	argv := []string{
		"-D", s.dataDir(),
		"-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + s.dir,
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
	}
	if s.preload != "" {
		argv = append(argv, "-c", "shared_preload_libraries="+s.preload)
	}
	return argv
}

// launch starts the postmaster on s.port and waits until it accepts
// connections. When it fails, the process is gone and the error carries
// the log.
func (s *PGServer) launch() error {
	info, err := os.Stat(s.logPath())
	if err != nil {
		return err
	}
	err = s.run(exec.Command(filepath.Join(s.bin, "postgres"), s.argv()...), func(cmd *exec.Cmd) error {
		exited, err := startWatched(cmd)
		if err != nil {
			return err
		}
		s.cmd, s.exited = cmd, exited
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.waitReady(); err != nil {
		s.kill()
		tail := s.logTail(info.Size())
		if strings.Contains(tail, "could not bind") || strings.Contains(tail, "already in use") {
			err = fmt.Errorf("%w: %w", errPortInUse, err)
		}
		return fmt.Errorf("%w; log:\n%s", err, tail)
	}
	return nil
}

// waitReady polls until the server accepts connections, exits or runs out
// of time.
func (s *PGServer) waitReady() error {
	return pollReady("postgres", s.Addr(), pgReadyTimeout, s.cmd, s.exited, s.probe)
}

// probe checks that the server on s's address answers and is s's: after
// a failed bind, the port may belong to another test's server, which
// would answer just as well, but from another data directory.
func (s *PGServer) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var dataDir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		return err
	}
	if dataDir != s.dataDir() {
		return fmt.Errorf("%s is served from %s, not from %s", s.Addr(), dataDir, s.dataDir())
	}
	return nil
}

// Addr returns the server's "127.0.0.1:port" address, which Stop and
// Start keep.
func (s *PGServer) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// ConnString returns a postgres:// URL of database db on the server, for
// the superuser postgres. Every cluster has a database "postgres".
func (s *PGServer) ConnString(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(pgUser),
		Host:     s.Addr(),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// NewDatabase creates a new, empty database on the server for the test.
// It is not dropped: the cluster is thrown away whole.
func (s *PGServer) NewDatabase(t testing.TB) *PGDatabase {
	t.Helper()
	return createDatabase(t, s.ConnString("postgres"), false)
}

// Stop shuts the server down as pg_ctl stop -m fast does (SIGINT: end the
// sessions, write a checkpoint, exit) and returns once the postmaster has
// exited, so that a connection attempted after Stop returns is refused.
// Stopping a server that is not running does nothing.
func (s *PGServer) Stop(t testing.TB) {
	t.Helper()
	if !s.running() {
		return
	}
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("servers: stop postgres %s: %v", s.Addr(), err)
	}
	select {
	case <-s.exited:
	case <-time.After(pgStopTimeout):
		t.Fatalf("servers: postgres %s still running %v after a fast shutdown began", s.Addr(), pgStopTimeout)
	}
}

// Start starts a server that [PGServer.Stop] stopped, with the same data on
// the same address, and returns once it accepts connections. Starting a
// running server fails the test.
func (s *PGServer) Start(t testing.TB) {
	t.Helper()
	if s.running() {
		t.Fatalf("servers: postgres %s is running already", s.Addr())
	}
	if err := s.launch(); err != nil {
		t.Fatalf("servers: restart postgres on %s: %v", s.Addr(), err)
	}
}

func (s *PGServer) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// kill ends the server with an immediate shutdown (SIGQUIT), which also
// ends its backends and frees its shared memory, and SIGKILLs it if that
// takes longer than pgKillGrace.
func (s *PGServer) kill() {
	if !s.running() {
		return
	}
	// A failed signal means the process is gone already, which is the goal.
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.exited:
	case <-time.After(pgKillGrace):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// logTail returns the last lines initdb and the server logged after byte
// offset from.
func (s *PGServer) logTail(from int64) string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	lines := strings.SplitAfter(string(b[min(from, int64(len(b))):]), "\n")
	return strings.Join(lines[max(0, len(lines)-logTailLines):], "")
}

// ReturnedOrWaiting waits until a call has sent its result on done, and
// then puts it back, or until a session of pool's database waits for a
// lock; it reports whether the call returned. It is the barrier of a test
// whose call may either finish or block on a lock another transaction of
// the test holds, with no sleep deciding which. The database must be the
// test's own (as [Postgres] gives), so that a session waiting there is
// the test's. It fails t if neither happens within a minute.
func ReturnedOrWaiting(t testing.TB, pool *pgxpool.Pool, done chan error) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		select {
		case err := <-done:
			done <- err
			return true
		default:
		}
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			t.Fatal("the call neither returned nor waited for a lock")
		case err != nil:
			t.Fatal(err)
		case waiting:
			return false
		}
		time.Sleep(time.Millisecond)
	}
}
