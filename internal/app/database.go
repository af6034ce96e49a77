package app

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/dberr"
)

// Database kinds.
const (
	Postgres = "postgres"
	SQLite   = "sqlite"
)

// Database says which database idemd uses.
type Database struct {
	// Kind is Postgres or SQLite.
	Kind string
	// URL is the PostgreSQL connection URL (Kind Postgres).
	URL string
	// Path is the SQLite file (Kind SQLite).
	Path string
	// PasswordFile, when set (Kind Postgres, -db-password-file), is the
	// file of the password, read again for every new connection.
	PasswordFile string
}

var (
	schemeRe = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9+.-]+):`)
	// keywordDSNRe finds a libpq keyword/value connection string
	// ("host=db user=app password=..."), which pgx accepts but -db does
	// not: it would be taken for a SQLite file name.
	keywordDSNRe = regexp.MustCompile(`(?i)(^|\s)(host|hostaddr|port|user|password|dbname|sslmode|service|connect_timeout)\s*=`)
	// userInfoRe finds a URL that lost its scheme ("//app:secret@db/pay"):
	// USER:PASSWORD@ in the first segment of what would be a file name.
	userInfoRe = regexp.MustCompile(`^(//)?[^/@:]*:[^/@]*@`)
)

// ParseDatabase reads the -db setting:
//
//   - postgres://... or postgresql://...: PostgreSQL (a pgx connection URL).
//   - sqlite:PATH (sqlite:///abs/path works too): SQLite file PATH.
//   - anything without a scheme: a SQLite file path.
//
// Any other scheme is an error, as is a PATH containing '?', one that looks
// like a keyword/value connection string, or one that looks like a URL
// without its scheme (USER:PASSWORD@HOST...).
func ParseDatabase(s string) (Database, error) {
	if strings.TrimSpace(s) == "" {
		return Database{}, fmt.Errorf("no database given")
	}
	if strings.TrimSpace(s) != s {
		// "./idemd.db " would open another, empty database.
		return Database{}, fmt.Errorf("database %q has leading or trailing spaces", redactURL(s))
	}
	m := schemeRe.FindStringSubmatch(s)
	if m == nil {
		return sqlitePath(s)
	}
	switch strings.ToLower(m[1]) {
	case "postgres", "postgresql":
		if _, err := pgxpool.ParseConfig(s); err != nil {
			// pgx's message quotes the URL, its passwords hidden.
			return Database{}, fmt.Errorf("bad PostgreSQL URL: %v", errMessage(err))
		}
		return Database{Kind: Postgres, URL: s}, nil
	case "sqlite", "sqlite3":
		p := s[len(m[0]):]
		if rest, ok := strings.CutPrefix(p, "//"); ok {
			p = rest
		}
		return sqlitePath(p)
	}
	return Database{}, fmt.Errorf("unknown database scheme %q in %s: want postgres://..., sqlite:PATH or a file path", m[1], redactURL(s))
}

func sqlitePath(p string) (Database, error) {
	switch {
	case p == "":
		return Database{}, fmt.Errorf("empty SQLite path")
	case p == ":memory:":
		// Gone at every restart, idempotency records and payments
		// included: a retried key would run again.
		return Database{}, fmt.Errorf("an in-memory SQLite database (%s) loses everything at a restart: give a file path", p)
	case strings.ContainsAny(p, "?#"):
		return Database{}, fmt.Errorf("SQLite path %q must not contain '?' or '#'", p)
	case userInfoRe.MatchString(p):
		// Not quoted back: it holds a password.
		return Database{}, errors.New("the database looks like a URL without its scheme (USER:PASSWORD@HOST...), " +
			"which would be taken for a SQLite file name: give postgres://USER:PASSWORD@HOST:PORT/DBNAME")
	case keywordDSNRe.MatchString(p):
		// Not quoted back: it may hold a password.
		return Database{}, errors.New("the database looks like a PostgreSQL keyword/value connection string (host=... user=...), " +
			"which would be taken for a SQLite file name: give a URL, postgres://USER:PASSWORD@HOST:PORT/DBNAME?sslmode=MODE, " +
			"with the string's other parameters (sslmode, sslrootcert, ...) as query parameters")
	}
	return Database{Kind: SQLite, Path: p}, nil
}

// urlPasswordRe finds a password in a PostgreSQL URL: in its user info
// (postgres://user:password@host) or its password parameter.
var urlPasswordRe = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#@]*:[^/?#@]*@|[?&]password=`)

// withPasswordFile returns d with the password of file (-db-password-file):
// refused for SQLite, for a URL that carries a password already, and for a
// file that cannot be read, is empty or holds more than one line.
func (d Database) withPasswordFile(file string) (Database, error) {
	switch {
	case d.Kind != Postgres:
		return Database{}, errors.New("only with a PostgreSQL -db (SQLite has no password)")
	case urlPasswordRe.MatchString(d.URL):
		return Database{}, fmt.Errorf("the PostgreSQL password is given twice: in -db's URL (%s) and by the file; drop it from the URL", d)
	}
	if _, err := readPasswordFile(file); err != nil {
		return Database{}, errors.New(errMessage(err))
	}
	d.PasswordFile = file
	return d, nil
}

// poolConfig returns the configuration of a pool of d (Kind Postgres):
// with PasswordFile, every new connection reads the password from it.
func (d Database) poolConfig() (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		return nil, err
	}
	if d.PasswordFile != "" {
		// The outbox listener's connection runs it too (pgdriver
		// ListenOutbox, without -db-listen).
		pcfg.BeforeConnect = passwordFromFile(d.PasswordFile)
	}
	return pcfg, nil
}

// listenBeforeConnect returns pgdriver's Config.ListenBeforeConnect for
// -db-listen's connection: with PasswordFile it reads the password from
// it for every connection, as the pool's BeforeConnect does (pgdriver runs
// that one only without a ListenConnConfig). Nil without PasswordFile.
func (d Database) listenBeforeConnect() func(context.Context, *pgx.ConnConfig) error {
	if d.PasswordFile == "" {
		return nil
	}
	return passwordFromFile(d.PasswordFile)
}

// passwordFromFile is a BeforeConnect that sets the password of file.
func passwordFromFile(file string) func(context.Context, *pgx.ConnConfig) error {
	return func(_ context.Context, cc *pgx.ConnConfig) error {
		pw, err := readPasswordFile(file)
		if err != nil {
			return fmt.Errorf("-db-password-file: %s", errMessage(err))
		}
		cc.Password = string(pw)
		return nil
	}
}

// String describes the database for humans, without the password.
func (d Database) String() string {
	if d.Kind == Postgres {
		return redactURL(d.URL)
	}
	return "sqlite:" + d.Path
}

// redactURL hides the passwords of a URL or connection string: the one of
// its user info and the password and sslpassword parameters, with pgx's own
// redaction (that of its parse errors), which also masks what looks like a
// password in a malformed URL (an unencoded '/' in it, say). A string it
// cannot handle is not shown at all.
func redactURL(s string) string {
	const prefix, suffix = "cannot parse `", "`: "
	msg := pgconn.NewParseConfigError(s, "", nil).Error()
	if r, ok := strings.CutPrefix(msg, prefix); ok {
		if r, ok := strings.CutSuffix(r, suffix); ok {
			return r
		}
	}
	return "(redacted)"
}

// errMessage keeps an error on one line.
func errMessage(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// dropReadOnly is the pool's PrepareConn: it destroys a connection whose
// session is read-only (dberr.ReadOnly: a hot standby, or a database or
// role set read-only, as PostgreSQL 14 and later report it, without a
// round trip; askReadOnly asks a server that does not report it) and fails the acquire with an error of SQLSTATE 25006, which
// idem counts as the database's passing failure (503 store-unavailable, a
// consumer's batch retried).
//
// Without it the pool kept, after a failover, the connections it had
// opened to a hot standby (or while a DBA had set the database or role
// read-only) until they expired (MaxConnLifetime, an hour), each command
// refused with 25006 although the new primary took writes; now every
// command reconnects until it reaches a writable session (with several
// hosts in -db, target_session_attrs=read-write makes pgx pick the
// primary).
func dropReadOnly(_ context.Context, conn *pgx.Conn) (bool, error) {
	pc := conn.PgConn()
	if err := dberr.ReadOnly(pc.ParameterStatus); err != nil {
		return false, fmt.Errorf("%w (server %s); connection dropped, the next command reconnects "+
			"(with several hosts in -db, add target_session_attrs=read-write to reach the primary)", err, pc.Conn().RemoteAddr())
	}
	return true, nil
}

// askReadOnly is the pool's AfterConnect: on a server that does not report
// whether a session is read-only (PostgreSQL 12 and 13, or a pooler that
// does not pass in_hot_standby on), it asks, once per connection, and
// refuses a read-only one with dropReadOnly's error (SQLSTATE 25006). A
// session's read-only state is fixed when it starts (a standby stays one
// until its server restarts; default_transaction_read_only set for a role
// or database applies to the sessions started after), so asking at
// connect is what dropReadOnly's check at each acquire is on 14 and later.
// Before, on 12 and 13, the pool kept the connections it opened while the
// database was read-only, and every command on them got 503 until they
// expired (MaxConnLifetime, an hour).
func askReadOnly(ctx context.Context, conn *pgx.Conn) error {
	return readOnlyAtConnect(ctx, conn, false)
}

// readOnlyAtConnect is askReadOnly; always asks even a server that reports
// it (the tests' way to run the path of 12 and 13 on a newer server).
func readOnlyAtConnect(ctx context.Context, conn *pgx.Conn, always bool) error {
	pc := conn.PgConn()
	if !always && pc.ParameterStatus("in_hot_standby") != "" {
		return nil // reported: dropReadOnly reads it at each acquire
	}
	// The simple protocol: no prepared statement, also through a pooler.
	res, err := pc.Exec(ctx, `SELECT current_setting('transaction_read_only')`).ReadAll()
	if err != nil {
		return err
	}
	if len(res) == 1 && len(res[0].Rows) == 1 && string(res[0].Rows[0][0]) == "on" {
		return fmt.Errorf("%w (server %s); connection refused, the next command connects again "+
			"(with several hosts in -db, add target_session_attrs=read-write to reach the primary)",
			dberr.ReadOnlySession("transaction_read_only"), pc.Conn().RemoteAddr())
	}
	return nil
}
