// Package pgbouncer starts a PgBouncer process in transaction pooling mode
// in front of a PostgreSQL server, for the tests (internal/testdb) and the
// benchmarks (bench/httpbench) that run idem behind a pooler.
package pgbouncer

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

	"github.com/idemkit/idem/internal/freeport"
)

// ErrNotInstalled is returned by Lookup and Start when there is no
// pgbouncer program (Debian: apt-get install pgbouncer).
var ErrNotInstalled = errors.New("pgbouncer is not installed (Debian: apt-get install pgbouncer)")

// Lookup returns the path of the pgbouncer program: on PATH, or Debian's
// /usr/sbin/pgbouncer.
func Lookup() (string, error) {
	if bin, err := exec.LookPath("pgbouncer"); err == nil {
		return bin, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNotInstalled
}

// Config says what PgBouncer pools.
type Config struct {
	// DSN names the server, and the user PgBouncer connects as (and its
	// password, if any). Clients connect as that user to any database of
	// the server, under its own name; URL names DSN's.
	DSN string
	// PoolSize bounds PgBouncer's server connections, all databases
	// together (default_pool_size, max_db_connections,
	// max_user_connections).
	PoolSize int
	// ConnectQuery, if not empty, runs on each new server connection:
	// PgBouncer does not pass search_path (nor most settings) given at
	// connection start on, so a "SET search_path = ..." goes here.
	ConnectQuery string
}

// Process is a running PgBouncer in transaction pooling mode (pool_mode =
// transaction: a client holds a server connection for one transaction, or
// one statement outside a transaction).
type Process struct {
	// URL is DSN's database through PgBouncer.
	URL string
	// Version is what pgbouncer --version printed first ("PgBouncer 1.18.0").
	Version string

	cmd *exec.Cmd
	dir string
	log lockedBuffer
}

// Start starts PgBouncer on a free port of 127.0.0.1 and waits until it
// listens. Stop it with Stop. As root it runs as the user postgres (it
// refuses to run as root).
func Start(ctx context.Context, cfg Config) (*Process, error) {
	bin, err := Lookup()
	if err != nil {
		return nil, err
	}
	pg, err := pgx.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: parse dsn: %w", err)
	}
	for _, s := range []string{pg.Host, pg.User, pg.Password, pg.Database} {
		if strings.ContainsAny(s, "' \t\n\\;=") {
			return nil, fmt.Errorf("pgbouncer: %q cannot be written into pgbouncer.ini", s)
		}
	}
	if strings.ContainsAny(cfg.ConnectQuery, "'\n\\") {
		return nil, fmt.Errorf("pgbouncer: connect query %q cannot be written into pgbouncer.ini", cfg.ConnectQuery)
	}
	size := max(cfg.PoolSize, 1)
	p := &Process{}
	if out, err := exec.CommandContext(ctx, bin, "--version").Output(); err == nil {
		p.Version, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	}
	port, err := freeport.Port()
	if err != nil {
		return nil, err
	}
	if p.dir, err = os.MkdirTemp("", "idem-pgbouncer-"); err != nil {
		return nil, err
	}
	var args []string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			p.Stop()
			return nil, fmt.Errorf("pgbouncer refuses to run as root, and there is no user postgres to run it as: %w", err)
		}
		args = append(args, "-u", u.Username)
		if err := os.Chmod(p.dir, 0o755); err != nil { // postgres reads its files
			p.Stop()
			return nil, err
		}
	}
	server := fmt.Sprintf("host=%s port=%d user=%s", pg.Host, pg.Port, pg.User)
	if pg.Password != "" {
		server += " password=" + pg.Password
	}
	if cfg.ConnectQuery != "" {
		server += " connect_query='" + cfg.ConnectQuery + "'"
	}
	// "*": every database of the server, under its own name.
	ini := fmt.Sprintf(`[databases]
* = %[1]s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[2]d
unix_socket_dir =
auth_type = trust
auth_file = %[3]s
pool_mode = transaction
max_client_conn = 500
default_pool_size = %[4]d
max_db_connections = %[4]d
max_user_connections = %[4]d
ignore_startup_parameters = extra_float_digits
`, server, port, filepath.Join(p.dir, "users.txt"), size)
	if err := os.WriteFile(filepath.Join(p.dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		p.Stop()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(p.dir, "users.txt"), []byte(strconv.Quote(pg.User)+` ""`+"\n"), 0o644); err != nil {
		p.Stop()
		return nil, err
	}
	p.cmd = exec.Command(bin, append(args, filepath.Join(p.dir, "pgbouncer.ini"))...)
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	if err := p.cmd.Start(); err != nil {
		p.Stop()
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
			p.Stop()
			return nil, fmt.Errorf("pgbouncer did not listen on %s: %w\n%s", addr, errors.Join(err, ctx.Err()), p.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	u := url.URL{Scheme: "postgres", User: url.User(pg.User), Host: addr, Path: "/" + pg.Database, RawQuery: "sslmode=disable"}
	p.URL = u.String()
	return p, nil
}

// Stop ends PgBouncer and removes its files.
func (p *Process) Stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	_ = os.RemoveAll(p.dir)
}

// Log returns what PgBouncer wrote so far.
func (p *Process) Log() string { return p.log.String() }

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

// Pid is PgBouncer's process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }
