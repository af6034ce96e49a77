package uniq

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// Constraint names a UNIQUE constraint (or unique index) of a table.
type Constraint struct {
	// Name is the constraint or index name. PostgreSQL reports it in the
	// error, so it is what Is compares there, and it is required there: a
	// Constraint without Name matches no PostgreSQL violation (CreateOrGet
	// returns an error saying so). Name the constraint
	// explicitly in the DDL (CONSTRAINT name UNIQUE (...)) instead of
	// relying on a generated name (an unquoted name may be given as
	// written: PostgreSQL reports it in lower case; a name longer than 63
	// bytes may be given in full: PostgreSQL keeps and reports its first
	// 63 bytes, which Is compares). On a partitioned
	// table PostgreSQL reports the partition's index, not the parent's
	// constraint, which Is then does not match: check each partition's
	// index name (one Constraint per partition). On
	// SQLite it matches violations of a unique index on expressions,
	// reported as "index 'name'".
	Name string
	// Table is the table the constraint belongs to, without schema.
	Table string
	// Columns are the constrained columns in index order. SQLite reports
	// table and columns, not the constraint name, so Is compares them
	// there (case-insensitively, as SQLite identifiers are).
	Columns []string
}

// SQLSTATE and SQLite extended result codes of a unique violation.
const (
	pgUniqueViolation          = "23505"
	sqliteConstraintUnique     = 2067 // SQLITE_CONSTRAINT_UNIQUE
	sqliteConstraintPrimaryKey = 1555 // SQLITE_CONSTRAINT_PRIMARYKEY
)

// sqliteUniquePrefix starts the part of a SQLite message naming what was
// violated: "UNIQUE constraint failed: payment.payment_provider, ...".
const sqliteUniquePrefix = "UNIQUE constraint failed: "

// Is reports whether err, or an error it wraps, is a unique violation of c:
//
//   - PostgreSQL (pgx, and database/sql through the pgx stdlib driver): a
//     *pgconn.PgError with SQLSTATE 23505 and ConstraintName equal to
//     c.Name (or to c.Name in lower case, as PostgreSQL stores an
//     unquoted name), truncated to 63 bytes at a UTF-8 character boundary
//     as PostgreSQL truncates a longer identifier.
//   - PostgreSQL through another driver (lib/pq's *pq.Error): an error
//     with a SQLState() string method returning 23505, whose constraint
//     name (a ConstraintName() string method, else a string field
//     Constraint or ConstraintName, else the quoted name in the server's
//     message `... unique constraint "name"`) equals c.Name.
//   - SQLite (modernc.org/sqlite, detected through its Code() int method,
//     without importing the driver): extended code 2067
//     (SQLITE_CONSTRAINT_UNIQUE) or 1555 (SQLITE_CONSTRAINT_PRIMARYKEY)
//     whose message names exactly c.Table and c.Columns, in order; or, for
//     a unique index on expressions, the index c.Name.
//
// Any other error, including a violation of another unique constraint of the
// same table, gives false; so does any PostgreSQL error when c.Name is empty.
func Is(err error, c Constraint) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == pgUniqueViolation && pgNameIs(pgErr.ConstraintName, c.Name)
	}
	var stated interface {
		error
		SQLState() string
	}
	if errors.As(err, &stated) {
		return stated.SQLState() == pgUniqueViolation && pgNameIs(constraintName(stated), c.Name)
	}
	var coded interface {
		error
		Code() int
	}
	if errors.As(err, &coded) {
		code := coded.Code()
		if code != sqliteConstraintUnique && code != sqliteConstraintPrimaryKey {
			return false
		}
		return sqliteMatches(coded.Error(), code, c)
	}
	return false
}

// isPGUniqueViolation reports whether err, or an error it wraps, is a
// PostgreSQL unique violation of any constraint (SQLSTATE 23505).
func isPGUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == pgUniqueViolation
	}
	var stated interface {
		error
		SQLState() string
	}
	return errors.As(err, &stated) && stated.SQLState() == pgUniqueViolation
}

// pgMaxIdentifierLen is the longest identifier PostgreSQL keeps, in bytes
// (NAMEDATALEN-1): a longer one is truncated, with a NOTICE, when the
// constraint is created, and reported truncated.
const pgMaxIdentifierLen = 63

// pgNameIs reports whether PostgreSQL's reported constraint name is name:
// the same, or name folded to lower case as PostgreSQL folds an unquoted
// identifier (CONSTRAINT Payment_Key UNIQUE ... is reported as
// payment_key), either truncated as PostgreSQL truncates an identifier
// longer than 63 bytes.
func pgNameIs(reported, name string) bool {
	if name == "" {
		return false
	}
	if reported == name || reported == pgTruncate(name) {
		return true
	}
	lower := []byte(name)
	for i, b := range lower {
		if 'A' <= b && b <= 'Z' {
			lower[i] = b + ('a' - 'A')
		}
	}
	return reported == pgTruncate(string(lower))
}

// pgTruncate cuts name to the 63 bytes PostgreSQL keeps of an identifier,
// at a UTF-8 character boundary (pg_mbcliplen, with the UTF8 server
// encoding): a character that does not fit whole is dropped.
func pgTruncate(name string) string {
	if len(name) <= pgMaxIdentifierLen {
		return name
	}
	n := pgMaxIdentifierLen
	for n > 0 && !utf8.RuneStart(name[n]) {
		n--
	}
	return name[:n]
}

// sqliteMatches reports whether the SQLite message msg of an error with the
// given code names c. modernc.org/sqlite writes
// "constraint failed: UNIQUE constraint failed: t.a, t.b (2067)".
func sqliteMatches(msg string, code int, c Constraint) bool {
	_, target, ok := strings.Cut(msg, sqliteUniquePrefix)
	if !ok {
		return false
	}
	target = strings.TrimSuffix(target, " ("+strconv.Itoa(code)+")")
	if name, ok := strings.CutPrefix(target, "index '"); ok {
		name, ok = strings.CutSuffix(name, "'")
		return ok && c.Name != "" && strings.EqualFold(name, c.Name)
	}
	cols := strings.Split(target, ", ")
	if c.Table == "" || len(cols) != len(c.Columns) {
		return false
	}
	for i, qualified := range cols {
		table, col, ok := strings.Cut(qualified, ".")
		if !ok || !strings.EqualFold(table, c.Table) || !strings.EqualFold(col, c.Columns[i]) {
			return false
		}
	}
	return true
}

// constraintName returns the constraint an error with a SQLSTATE names, or
// "" when it names none: through a ConstraintName method, a string field
// Constraint (lib/pq) or ConstraintName, or the server's message.
func constraintName(err error) string {
	if n, ok := err.(interface{ ConstraintName() string }); ok {
		return n.ConstraintName()
	}
	v := reflect.ValueOf(err)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		for _, field := range []string{"Constraint", "ConstraintName"} {
			if f := v.FieldByName(field); f.IsValid() && f.Kind() == reflect.String && f.String() != "" {
				return f.String()
			}
		}
	}
	_, name, ok := strings.Cut(err.Error(), `unique constraint "`)
	if !ok {
		return ""
	}
	name, _, ok = strings.Cut(name, `"`)
	if !ok {
		return ""
	}
	return name
}
