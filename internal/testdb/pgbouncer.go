package testdb

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
)

// bouncerServerConns is the most PostgreSQL connections one PgBouncer of
// the tests opens (max_db_connections); PgBouncer takes that many of the
// tests' connection slots (acquireSlot) for as long as it runs, so that it
// never pushes the machine's tests past the server's max_connections.
const bouncerServerConns = 12

// PgBouncer starts a PgBouncer in transaction pooling mode (pool_mode =
// transaction: a client holds a server connection only for the duration
// of a transaction, or of one statement outside a transaction) in front of
// the test database, and returns its URL. It stops when the test ends.
//
// PgBouncer must be installed (Debian: apt-get install pgbouncer). Without
// it the test fails under CI=true and is skipped otherwise, so that the
// README's test command still runs on a machine that lacks it; .ci/run
// installs it.
func PgBouncer(t testing.TB) string {
	t.Helper()
	RequirePostgres(t)
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr == nil {
			bin, err = "/usr/sbin/pgbouncer", nil
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pgbouncer is required under CI (apt-get install pgbouncer): %v", err)
		}
		t.Skipf("pgbouncer not installed (apt-get install pgbouncer; CI requires it): %v", err)
	}
	pg, err := pgx.ParseConfig(DSN())
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	port := freePort(t)
	dir, err := os.MkdirTemp("", "idem-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// PgBouncer refuses to run as root: as root, it runs as postgres (-u),
	// which must read its files.
	var args []string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgbouncer refuses to run as root, and there is no user postgres to run it as: %v", err)
		}
		args = append(args, "-u", u.Username)
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// "*": every database of the server, under its own name (the
	// end-to-end tests make one per test).
	ini := fmt.Sprintf(`[databases]
* = host=%[1]s port=%[2]d user=%[3]s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[4]d
unix_socket_dir =
auth_type = trust
auth_file = %[5]s
pool_mode = transaction
max_client_conn = 500
default_pool_size = %[6]d
max_db_connections = %[6]d
max_user_connections = %[6]d
ignore_startup_parameters = extra_float_digits
`, pg.Host, pg.Port, pg.User, port, filepath.Join(dir, "users.txt"), bouncerServerConns)
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(strconv.Quote(pg.User)+` ""`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range bouncerServerConns {
		release, err := acquireSlot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(release) // after the process is gone (cleanups run last first)
	}
	var log lockedBuffer
	cmd := exec.Command(bin, append(args, filepath.Join(dir, "pgbouncer.ini"))...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("pgbouncer's log:\n%s", log.String())
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer did not listen on %s: %v\n%s", addr, err, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	u := url.URL{Scheme: "postgres", User: url.User(pg.User), Host: addr, Path: "/" + pg.Database, RawQuery: "sslmode=disable"}
	return u.String()
}

// BouncerPool opens a pool through the PgBouncer at bouncerURL (from
// PgBouncer). Its statements are not prepared by name
// (QueryExecModeCacheDescribe): PgBouncer before 1.21 does not keep a
// prepared statement across a client's transactions. It is closed when
// the test ends.
func BouncerPool(t testing.TB, bouncerURL string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(bouncerURL)
	if err != nil {
		t.Fatalf("parse pgbouncer url: %v", err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PostgresBehindPgBouncer returns a migrated pgdriver on a fresh schema,
// and the schema, whose pool goes through the PgBouncer at bouncerURL. The
// schema is named
// in pgdriver.Config.Schema: a search_path given at connection start is
// not passed on by PgBouncer.
func PostgresBehindPgBouncer(t testing.TB, bouncerURL string, cfg *pgdriver.Config) (*pgdriver.Driver, string) {
	t.Helper()
	_, schema := Schema(t, 2)
	c := pgdriver.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	drv, err := pgdriver.New(BouncerPool(t, bouncerURL, 10), &c)
	if err != nil {
		t.Fatalf("pgdriver: %v", err)
	}
	if err := drv.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return drv, schema
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// lockedBuffer is a bytes.Buffer safe for a process's two output streams.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// BouncerSQLDB is BouncerPool for database/sql: a pool of pgx's stdlib
// through the PgBouncer at bouncerURL, its statements not prepared by name.
// It is closed when the test ends.
func BouncerSQLDB(t testing.TB, bouncerURL string, maxConns int) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(bouncerURL)
	if err != nil {
		t.Fatalf("parse pgbouncer url: %v", err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// PostgresSQLBehindPgBouncer is PostgresBehindPgBouncer for pgsqldriver
// (over BouncerSQLDB).
func PostgresSQLBehindPgBouncer(t testing.TB, bouncerURL string) (*pgsqldriver.Driver, string) {
	t.Helper()
	_, schema := Schema(t, 2)
	drv, err := pgsqldriver.New(BouncerSQLDB(t, bouncerURL, 24), &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgsqldriver: %v", err)
	}
	if err := drv.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return drv, schema
}

// Churn runs other clients' short transactions through pool (one through
// PgBouncer) from 4 goroutines, so that PgBouncer moves a client's
// statements outside a transaction between its server connections, as on
// a busy service. It stops when stop is called or the test ends.
func Churn(t testing.TB, pool *pgxpool.Pool) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				_, _ = pool.Exec(context.Background(), "SELECT pg_sleep(0.001)")
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}
