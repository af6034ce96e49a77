// Package pgsql holds what idem's two PostgreSQL backends share: the
// migrations, the texts of their SQL statements, the SQLSTATE codes they map
// and the names and lock keys derived from a configuration. pgdriver runs the
// statements through pgx (pipelined where it can), pgsqldriver through
// database/sql; both therefore have the same schema, the same migration
// table and the same advisory locks, and can share one database.
//
// Statement texts contain the placeholders {{table}} (qualified table-name
// prefix) and {{name}} (bare prefix for index and constraint names), which
// Names.Expand replaces. Array parameters are cast in the SQL ($1::uuid[]),
// so a backend may bind them as typed arrays (pgx) or as PostgreSQL array
// literals in text (database/sql).
package pgsql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/dberr"
)

// SQLSTATE codes the backends map to driver errors.
const (
	CodeUniqueViolation  = "23505" // unique_violation
	CodeLockNotAvailable = "55P03" // lock_not_available (lock_timeout)
	CodeUndefinedTable   = "42P01" // undefined_table
	CodeInvalidSchema    = "3F000" // invalid_schema_name
	// CodeInFailedSQLTransaction: a statement failed earlier in the
	// transaction, which PostgreSQL aborted; only ROLLBACK is accepted.
	CodeInFailedSQLTransaction = "25P02" // in_failed_sql_transaction
)

// SQLState returns the SQLSTATE of err (pgconn.PgError, or any error with
// a SQLState method), or "".
func SQLState(err error) string { return dberr.SQLState(err) }

// IsConstraintClass reports whether err is an integrity constraint
// violation (SQLSTATE class 23): at COMMIT, a deferred constraint that
// failed, and the transaction was rolled back.
func IsConstraintClass(err error) bool { return strings.HasPrefix(SQLState(err), "23") }

// Refused reports whether err is PostgreSQL's ERROR (not FATAL or PANIC)
// answer to a statement: the server went on, and the statement (a
// COMMIT too) did not commit anything. An ERROR raised after a COMMIT's
// commit record is written becomes a PANIC, and a FATAL (a shutdown, a
// terminated backend) may follow a COMMIT that committed: neither is one.
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	sev := pgErr.SeverityUnlocalized // PostgreSQL 9.6 and later
	if sev == "" {
		sev = pgErr.Severity
	}
	return sev == "ERROR"
}

// SessionEnded reports whether err, a ROLLBACK's, says the transaction's
// session was already over: the connection closed (pgconn.ErrConnClosed,
// database/sql's driver.ErrBadConn and sql.ErrConnDone, the server's EOF
// or reset) or ended by the server with a FATAL (SQLSTATE 57P01 to 57P03,
// 57P05, 25P03, 25P04, class 08). PostgreSQL rolls back the transaction of
// a session that ends: there is nothing left to roll back, and the failure
// was the statement's that found the session gone. A ROLLBACK that timed
// out is not one: the server may still hold the transaction (its locks)
// until it notices the connection closed.
func SessionEnded(err error) bool {
	switch code := SQLState(err); {
	case code == "57P01", code == "57P02", code == "57P03", code == "57P05",
		code == "25P03", code == "25P04", strings.HasPrefix(code, "08"):
		return true
	case code != "":
		return false
	}
	return errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, sqldriver.ErrBadConn) ||
		errors.Is(err, sql.ErrConnDone) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// IdentRe is what Config.Schema and Config.TablePrefix must match.
var IdentRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// ValidateConfig checks a schema and a table prefix; pkg prefixes the error.
func ValidateConfig(pkg, schema, prefix string) error {
	if schema != "" && !IdentRe.MatchString(schema) {
		return fmt.Errorf("%s: Schema %q must match %s", pkg, schema, IdentRe)
	}
	if prefix != "" && !IdentRe.MatchString(prefix) {
		return fmt.Errorf("%s: TablePrefix %q must match %s", pkg, prefix, IdentRe)
	}
	return nil
}

// MaxPartitionedPrefix is the longest Config.TablePrefix inbox
// partitioning takes: with it, the longest derived name
// (processed_event_unpartitioned_processed_at_idx, 46 characters) may be
// cut at 63 bytes but stays distinct from the others.
const MaxPartitionedPrefix = 31

// QuoteIdent quotes an identifier as pgx.Identifier.Sanitize does.
func QuoteIdent(s string) string {
	s = strings.ReplaceAll(s, string([]byte{0}), "")
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Names are the names a configuration (schema, table prefix) gives idem's
// tables, with the expansion of statement templates.
type Names struct {
	Schema string
	// Table is the qualified prefix of table names: "schema".prefix.
	Table string
	// Name is the bare prefix of index and constraint names.
	Name string

	replacer *strings.Replacer
	cache    sync.Map // template -> expanded SQL
	prefix   string
	// resolved are the names of the schema holding the outbox table, when
	// Schema is "" (see Outbox).
	resolved atomic.Pointer[Names]
}

// NewNames returns the names of schema and prefix (validated by the caller).
func NewNames(schema, prefix string) *Names {
	n := &Names{Schema: schema, Table: prefix, Name: prefix, prefix: prefix}
	if schema != "" {
		n.Table = QuoteIdent(schema) + "." + prefix
	}
	n.replacer = strings.NewReplacer("{{table}}", n.Table, "{{name}}", n.Name)
	return n
}

// RecordKeyConstraint is the name of the idempotency record's primary key
// (migration 001): the unique violation that says another writer stored
// the key.
func (n *Names) RecordKeyConstraint() string { return n.Name + "idempotency_record_pkey" }

// Render replaces {{table}} and {{name}} in sql, without caching (for
// migrations).
func (n *Names) Render(sql string) string { return n.replacer.Replace(sql) }

// Expand replaces {{table}} and {{name}} in an SQL template. Templates are
// constants, so each is expanded once and cached (the statements are on the
// hot path of every request).
func (n *Names) Expand(sql string) string {
	if v, ok := n.cache.Load(sql); ok {
		return v.(string)
	}
	out := n.replacer.Replace(sql)
	n.cache.Store(sql, out)
	return out
}

// OutboxChannel is the notification channel on which OutboxInsert signals
// new outbox rows: "<schema>.<prefix>idem_outbox", or "<prefix>idem_outbox"
// without a schema (use it on the names of Outbox). A name longer than
// PostgreSQL's 63-byte identifier limit is replaced by a hash of it.
func (n *Names) OutboxChannel() string {
	ch := n.Name + "idem_outbox"
	if n.Schema != "" {
		ch = n.Schema + "." + ch
	}
	if len(ch) > 63 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(ch))
		ch = fmt.Sprintf("idem_outbox_%016x", h.Sum64())
	}
	return ch
}

// Outbox returns the names whose OutboxChannel and OutboxLockClass the
// outbox uses: n itself when n names a schema; otherwise those of the
// schema the outbox table is found in through search_path, which
// currentSchema reads (OutboxSchemaSQL) on the first call that succeeds
// (then cached: every connection of a driver must find the same schema).
// A driver configured without a schema thus gets the channel and the lane
// locks of one that names the schema, and services in different schemas of
// one database do not share them (they did: both were named after the
// prefix alone). If it reads "" (an empty search_path), n is used.
func (n *Names) Outbox(ctx context.Context, currentSchema func(context.Context) (string, error)) (*Names, error) {
	if n.Schema != "" {
		return n, nil
	}
	if r := n.resolved.Load(); r != nil {
		return r, nil
	}
	schema, err := currentSchema(ctx)
	if err != nil {
		return nil, err
	}
	if schema == "" {
		return n, nil
	}
	r := NewNames(schema, n.prefix)
	n.resolved.CompareAndSwap(nil, r)
	return n.resolved.Load(), nil
}

// OutboxKnown is the names Outbox returned, or n before any call.
func (n *Names) OutboxKnown() *Names {
	if r := n.resolved.Load(); r != nil {
		return r
	}
	return n
}

// LegacyOutboxLockClass is, for names without a schema, the lock class
// that versions before the schema was resolved (see Outbox) used: a claim
// also takes its lane lock in shared mode (OutboxLanesSQL's $5), so that
// during a rolling upgrade an old replica (which takes it exclusively) and
// a new one never hold the same lane, while new replicas in different
// schemas do not block each other. Nil for names with a schema (their
// class did not change).
func (n *Names) LegacyOutboxLockClass() *int32 {
	if n.Schema != "" {
		return nil
	}
	c := n.OutboxLockClass()
	return &c
}

// OutboxLockClass is the first key of the outbox lanes' advisory locks: a
// hash of the outbox table's name, so that idem schemas sharing a database
// do not block each other's lanes (use it on the names of Outbox).
func (n *Names) OutboxLockClass() int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(n.Table + "outbox"))
	return int32(h.Sum32()) //nolint:gosec // a lock ID: wrapping is fine
}

// RecordLockKey is the advisory lock of (scope, key) in this table (the
// ModeTx fast path): a 64-bit FNV-1a hash. Two keys that collide only
// serialise each other.
func (n *Names) RecordLockKey(scope, key string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(n.Table))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(scope))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(key))
	return int64(h.Sum64()) //nolint:gosec // a lock ID: wrapping is fine
}

// MigrateLockKey is the advisory lock that serialises migrators of one schema
// (whatever their prefixes: they share CREATE SCHEMA).
func (n *Names) MigrateLockKey() int64 {
	return MigrateLockKeyOf(n.Schema)
}

// MigrateLockKeyOf is the migration lock of the schema named schema. A
// driver configured without a schema uses the one its tables go to
// (current_schema()), so that it shares the lock with one that names it.
func MigrateLockKeyOf(schema string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("idem-migrate:" + schema))
	return int64(h.Sum64()) //nolint:gosec // a lock ID: wrapping is fine
}

// MigrationLockTimeout bounds each statement of a migration waiting for a
// table lock (set after the migration lock is held): a migration that must
// lock outbox or processed_event behind a long transaction gives up and is
// tried again, instead of queueing every write of the application behind
// its lock request.
const MigrationLockTimeout = "5s"

// HoldTimeoutMillis is the value of OutboxHoldTimeoutSQL for d (rounded up
// to the millisecond), and false for a d that sets nothing (not positive).
func HoldTimeoutMillis(d time.Duration) (string, bool) {
	if d <= 0 {
		return "", false
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return strconv.FormatInt(int64(min(ms, math.MaxInt32)), 10), true
}

// CurrentSchemaSQL reads the schema unqualified names are created in.
const CurrentSchemaSQL = `SELECT coalesce(current_schema(), '')`

// OutboxSchemaSQL reads the schema of the outbox table that search_path
// finds ($1: OutboxTableName), which is not always current_schema() (the
// first schema of the path that exists: with "$user", public, a role owning
// a schema of its name resolves to it while the tables are in public), or
// current_schema() before the table exists.
const OutboxSchemaSQL = `SELECT coalesce((SELECT n.nspname::text FROM pg_catalog.pg_class c
	JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)), current_schema(), '')`

// OutboxTableName is the outbox table's unqualified name, quoted, for
// OutboxSchemaSQL.
func (n *Names) OutboxTableName() string { return QuoteIdent(n.prefix + "outbox") }

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations returns the migrations rendered for n.
func (n *Names) Migrations() ([]driver.Migration, error) {
	ms, err := driver.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	for i := range ms {
		ms[i].SQL = n.Render(ms[i].SQL)
	}
	return ms, nil
}

// MigrationTableSQL returns the rendered SQL that creates the migration
// table (and the schema when it does not exist: see CreateSchemaSQL), for
// an external migration tool.
func (n *Names) MigrationTableSQL() string {
	s := ""
	if n.Schema != "" {
		s = CreateSchemaSQL(n.Schema) + ";\n"
	}
	return s + n.Render(MigrationTableSQL) + ";\n" + n.Render(MigrationCompatibleSQL) + ";\n"
}

// MigrationTableExistsSQL tells whether the migration table ($1: its
// rendered name, MigrationTableName) exists: when it does, the migrators
// run no CREATE, which a role without CREATE rights on the schema may not
// run even with IF NOT EXISTS.
const MigrationTableExistsSQL = `SELECT to_regclass($1) IS NOT NULL`

// SchemaExistsSQL tells whether the schema $1 exists.
const SchemaExistsSQL = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)`

// CreateSchemaSQL returns a statement that creates schema when it does not
// exist. Not CREATE SCHEMA IF NOT EXISTS alone: PostgreSQL checks CREATE
// on the database before it looks for the schema, and the role that
// migrates is often the owner of a schema a DBA created for it (CREATE
// SCHEMA ... AUTHORIZATION), which may create tables there but not schemas
// in the database.
func CreateSchemaSQL(schema string) string {
	body := "BEGIN IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = " + quoteLiteral(schema) +
		") THEN CREATE SCHEMA " + QuoteIdent(schema) + "; END IF; END"
	return "DO " + quoteLiteral(body)
}

// quoteLiteral quotes s as a string literal (standard_conforming_strings,
// on since PostgreSQL 9.1; schema names are [a-z0-9_] anyway).
func quoteLiteral(s string) string {
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}

// MigrationTableName is the migration table's rendered name, for
// MigrationHasCompatibleSQL.
func (n *Names) MigrationTableName() string { return n.Render("{{table}}idem_migration") }

// SagaListQuery returns the statement that lists the sagas in states, the
// next page's (after a cursor $3, $4) with after: SagaListUnfinishedSQL
// (or its next page) when none of states is final, so that a recovery
// loop's list reads the index of unfinished sagas; SagaListSQL (or
// SagaListAfterSQL) otherwise.
func SagaListQuery(states []string, after bool) string {
	unfinished := !slices.ContainsFunc(states, driver.SagaFinished)
	switch {
	case unfinished && after:
		return SagaListUnfinishedAfterSQL
	case unfinished:
		return SagaListUnfinishedSQL
	case after:
		return SagaListAfterSQL
	}
	return SagaListSQL
}
