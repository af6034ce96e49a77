package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// bouncer is a PgBouncer process that httpbench started in transaction
// pooling mode in front of -dsn's server (-pgbouncer).
type bouncer struct {
	url     string // the database of -dsn, through PgBouncer
	version string // "PgBouncer 1.18.0"
	size    int    // server connections at most (default_pool_size)
	cmd     *exec.Cmd
	dir     string
	log     lockedBuffer
}

// startPgBouncer starts PgBouncer with pool_mode = transaction and at most
// size server connections in front of dsn's server and database. PgBouncer
// passes no search_path (nor synchronous_commit) given at connection
// start, so each server connection sets them itself (connect_query):
// schema, and syncCommit unless empty. application_name is one of the
// parameters PgBouncer passes on: a client's is set on the server
// connection it is given.
func startPgBouncer(ctx context.Context, dsn, schema, syncCommit string, size int) (*bouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			return nil, fmt.Errorf("-pgbouncer: pgbouncer not installed (Debian: apt-get install pgbouncer): %w", err)
		}
		bin = "/usr/sbin/pgbouncer"
	}
	pg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse dsn: %w", err)
	}
	for _, s := range []string{pg.Host, pg.User, pg.Password, pg.Database, schema, syncCommit} {
		if strings.ContainsAny(s, "' \t\n\\;=") {
			return nil, fmt.Errorf("-pgbouncer: %q cannot be written into pgbouncer.ini by this bench", s)
		}
	}
	b := &bouncer{size: size}
	if out, err := exec.CommandContext(ctx, bin, "--version").Output(); err == nil {
		b.version, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	if b.dir, err = os.MkdirTemp("", "httpbench-pgbouncer-"); err != nil {
		return nil, err
	}
	// PgBouncer refuses to run as root: as root, it runs as postgres (-u),
	// which must read its files.
	var args []string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			b.removeDir()
			return nil, fmt.Errorf("-pgbouncer: pgbouncer refuses to run as root, and there is no user postgres to run it as: %w", err)
		}
		args = append(args, "-u", u.Username)
		if err := os.Chmod(b.dir, 0o755); err != nil {
			b.removeDir()
			return nil, err
		}
	}
	connectQuery := "SET search_path = " + schema
	if syncCommit != "" {
		connectQuery += "; SET synchronous_commit = " + syncCommit
	}
	server := fmt.Sprintf("host=%s port=%d user=%s dbname=%s", pg.Host, pg.Port, pg.User, pg.Database)
	if pg.Password != "" {
		server += " password=" + pg.Password
	}
	ini := fmt.Sprintf(`[databases]
%[1]s = %[2]s connect_query='%[3]s'
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
ignore_startup_parameters = extra_float_digits
`, pg.Database, server, connectQuery, port, filepath.Join(b.dir, "users.txt"), size)
	if err := os.WriteFile(filepath.Join(b.dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		b.removeDir()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(b.dir, "users.txt"), []byte(strconv.Quote(pg.User)+` ""`+"\n"), 0o644); err != nil {
		b.removeDir()
		return nil, err
	}
	b.cmd = exec.Command(bin, append(args, filepath.Join(b.dir, "pgbouncer.ini"))...)
	b.cmd.Stdout, b.cmd.Stderr = &b.log, &b.log
	if err := b.cmd.Start(); err != nil {
		b.removeDir()
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.stop()
			return nil, fmt.Errorf("pgbouncer did not listen on %s: %w\n%s", addr, errors.Join(err, ctx.Err()), b.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	u := url.URL{Scheme: "postgres", User: url.User(pg.User), Host: addr, Path: "/" + pg.Database, RawQuery: "sslmode=disable"}
	b.url = u.String()
	return b, nil
}

// stop ends PgBouncer and removes its files.
func (b *bouncer) stop() {
	if b.cmd != nil && b.cmd.Process != nil {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
	}
	b.removeDir()
}

func (b *bouncer) removeDir() { _ = os.RemoveAll(b.dir) }

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
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
