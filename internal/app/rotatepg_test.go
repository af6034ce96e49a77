package app_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
)

// passwordProxy stands in front of the test's PostgreSQL, whose pg_hba
// trusts every local connection: it asks each client for its password in
// clear, refuses any but the current one (28P01, as PostgreSQL does), and
// passes the accepted connections through.
type passwordProxy struct {
	addr string
	mu   sync.Mutex
	pw   string
	// accepted and refused count the connections.
	accepted, refused int
}

func newPasswordProxy(t *testing.T, upstream, pw string) *passwordProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &passwordProxy{addr: ln.Addr().String(), pw: pw}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, upstream)
		}
	}()
	return p
}

func (p *passwordProxy) setPassword(pw string) {
	p.mu.Lock()
	p.pw = pw
	p.mu.Unlock()
}

func (p *passwordProxy) counts() (accepted, refused int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted, p.refused
}

func (p *passwordProxy) serve(c net.Conn, upstream string) {
	defer c.Close()
	be := pgproto3.NewBackend(c, c)
	var startup *pgproto3.StartupMessage
	for startup == nil {
		msg, err := be.ReceiveStartupMessage()
		if err != nil {
			return
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := c.Write([]byte("N")); err != nil {
				return
			}
		case *pgproto3.StartupMessage:
			startup = m
		default:
			return
		}
	}
	be.Send(&pgproto3.AuthenticationCleartextPassword{})
	if be.Flush() != nil || be.SetAuthType(pgproto3.AuthTypeCleartextPassword) != nil {
		return
	}
	msg, err := be.Receive()
	if err != nil {
		return
	}
	pm, ok := msg.(*pgproto3.PasswordMessage)
	p.mu.Lock()
	good := ok && pm.Password == p.pw
	if good {
		p.accepted++
	} else {
		p.refused++
	}
	p.mu.Unlock()
	if !good {
		be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01",
			Message: fmt.Sprintf("password authentication failed for user %q", startup.Parameters["user"])})
		_ = be.Flush()
		return
	}
	up, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer up.Close()
	b, err := startup.Encode(nil)
	if err != nil {
		return
	}
	if _, err := up.Write(b); err != nil {
		return
	}
	splice(c, up)
}

// The PostgreSQL password rotated under a running idemd (Vault, a
// scheduled rotation): the new one written to -db-password-file, the old
// one refused by the server, and the sessions terminated (a failover,
// pg_terminate_backend). The pool's new connections and the outbox
// listener's reconnection read the file again: the next order is taken,
// its events flow, and the listener LISTENs again.
func TestPostgresPasswordRotation(t *testing.T) {
	t.Parallel()
	for _, listen := range []bool{false, true} {
		t.Run(fmt.Sprintf("db-listen=%v", listen), func(t *testing.T) {
			t.Parallel()
			dbArg, count := dbCounter(t, app.Postgres)
			u, err := url.Parse(dbArg)
			if err != nil {
				t.Fatal(err)
			}
			proxy := newPasswordProxy(t, u.Host, "old-s3cret")
			appName := fmt.Sprintf("rotate_%d", time.Now().UnixNano())
			u.Host, u.User = proxy.addr, url.User(u.User.Username())
			q := u.Query()
			q.Set("sslmode", "disable")
			q.Set("application_name", appName)
			u.RawQuery = q.Encode()
			pwFile := writeFile(t, "pgpassword", "old-s3cret\n")
			args := []string{"-db-password-file", pwFile}
			if listen {
				args = append(args, "-db-listen", u.String())
			}
			s := serveOn(t, u.String(), count, args...)
			first := s.do(http.MethodPost, "/v1/orders", "order-1", orderBody(7, "19.90"))
			if first.status != http.StatusCreated {
				t.Fatalf("POST: %d %s", first.status, first.body)
			}
			id, _ := first.json(t)["id"].(string)
			s.waitStatus(id, "CONFIRMED")

			replaceFile(t, pwFile, "new-s3cret\n")
			proxy.setPassword("new-s3cret")
			pool := testdb.Pool(t, q.Get("search_path"), 2)
			ctx := context.Background()
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&n); err != nil || n == 0 {
				t.Fatalf("terminating idemd's sessions: %d, %v", n, err)
			}

			var second response
			for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				// The first requests may meet a connection the server
				// has just terminated: 503, retried.
				if second = s.do(http.MethodPost, "/v1/orders", "order-2", orderBody(7, "5.00")); second.status != http.StatusServiceUnavailable {
					break
				}
			}
			if second.status != http.StatusCreated {
				t.Fatalf("POST after the rotation: %d %s", second.status, second.body)
			}
			id, _ = second.json(t)["id"].(string)
			s.waitStatus(id, "CONFIRMED")
			s.waitSummary(7, "orders=2 pending=0 confirmed=2 rejected=0 total_amount=24.9000")
			// The listener is back (it retries every 5 s at most).
			var listening int
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && listening == 0; time.Sleep(100 * time.Millisecond) {
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`, appName).Scan(&listening); err != nil {
					t.Fatal(err)
				}
			}
			if listening == 0 {
				accepted, refused := proxy.counts()
				t.Fatalf("no LISTEN session after the rotation (connections accepted %d, refused %d)", accepted, refused)
			}
		})
	}
}

// -db-password-file's mistakes stop idemd at start-up (exit 2), naming the
// setting, never quoting a password.
func TestParseConfigDBPasswordFile(t *testing.T) {
	t.Parallel()
	pw := writeFile(t, "pgpassword", "s3cret\n")
	empty := writeFile(t, "empty", "\n")
	pg := "postgres://app@db.example.com:5432/pay"
	cfg, err := app.ParseConfig([]string{"-db", pg, "-db-password-file", pw}, envOf(nil))
	if err != nil || cfg.DB.PasswordFile != pw {
		t.Fatalf("ParseConfig: %+v, %v", cfg.DB, err)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"sqlite", []string{"-db", "sqlite:x.db", "-db-password-file", pw}, "only with a PostgreSQL -db"},
		{"password in the URL", []string{"-db", "postgres://app:0ld@db/pay", "-db-password-file", pw}, "given twice"},
		{"password parameter", []string{"-db", pg + "?sslmode=disable&password=0ld", "-db-password-file", pw}, "given twice"},
		{"password in -db-listen", []string{"-db", pg, "-db-listen", "postgres://app:0ld@direct/pay", "-db-password-file", pw}, "given twice"},
		{"empty file", []string{"-db", pg, "-db-password-file", empty}, "empty"},
		{"missing file", []string{"-db", pg, "-db-password-file", empty + ".missing"}, "no such file"},
	} {
		_, err := app.ParseConfig(c.args, envOf(nil))
		var ce *app.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "-db") ||
			strings.Contains(err.Error(), "0ld") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %v, want a *ConfigError saying %q", c.name, err, c.want)
		}
	}
	// The environment variable, as the flag.
	if cfg, err := app.ParseConfig([]string{"-db", pg}, envOf(map[string]string{"IDEMD_DB_PASSWORD_FILE": pw})); err != nil || cfg.DB.PasswordFile != pw {
		t.Errorf("IDEMD_DB_PASSWORD_FILE: %+v, %v", cfg.DB, err)
	}
}

// idemd migrate and idemd outbox take -db-password-file (and
// IDEMD_DB_PASSWORD_FILE) too: with idemd's environment they reach a
// database whose password is in the file.
func TestSubcommandsDBPasswordFile(t *testing.T) {
	t.Parallel()
	dbArg, _ := dbCounter(t, app.Postgres)
	u, err := url.Parse(dbArg)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newPasswordProxy(t, u.Host, "s3cret")
	u.Host = proxy.addr
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	pwFile := writeFile(t, "pgpassword", "s3cret\n")
	code, stdout, stderr := run(t, []string{"migrate", "up", "-db", u.String(), "-db-password-file", pwFile}, nil)
	if code != 0 || !strings.Contains(stdout, "applied 001_") {
		t.Fatalf("migrate up: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	env := map[string]string{"IDEMD_DB": u.String(), "IDEMD_DB_PASSWORD_FILE": pwFile}
	for _, args := range [][]string{{"migrate", "status"}, {"outbox", "redrive", "-all"}, {"outbox", "unpark", "-all"}} {
		if code, stdout, stderr := run(t, args, env); code != 0 {
			t.Errorf("%v: code %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	if _, refused := proxy.counts(); refused != 0 {
		t.Errorf("%d connections refused", refused)
	}
	// Without the file, the server refuses them.
	if code, _, _ := run(t, []string{"migrate", "status", "-db", u.String()}, nil); code != 1 {
		t.Errorf("migrate status without the password: code %d, want 1", code)
	}
}
