package pgsql

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// tablePrivileges are idem's tables (before the prefix) and the privileges
// the application's role needs on each, those its statements use: SELECT,
// INSERT, UPDATE and DELETE on the tables the claims, the inbox, the
// outbox's relay, sagas, leases and cleanup write (UPDATE also for the
// sweeps' FOR UPDATE SKIP LOCKED), but no UPDATE on outbox (an event is
// written once), and SELECT on the migration table that Validate and
// MigrationStatus read. Nothing else: the identity columns need no
// sequence privilege, advisory locks and LISTEN/NOTIFY none, and the
// outbox's triggers run the inserting role's INSERT and DELETE on
// outbox_pending and outbox_published. A role granted more passes; one
// granted less than this fails a feature at its first use.
var tablePrivileges = []struct {
	table string
	privs []string
}{
	{"idem_migration", []string{"SELECT"}},
	{"idempotency_record", dml},
	{"processed_event", dml},
	{"outbox", []string{"SELECT", "INSERT", "DELETE"}},
	{"outbox_pending", dml},
	{"outbox_published", dml},
	{"idem_lock", dml},
	{"saga", dml},
	{"saga_step", dml},
}

var dml = []string{"SELECT", "INSERT", "UPDATE", "DELETE"}

// MissingPrivilegesSQL returns a query of the privileges the session's
// role lacks on n's tables: rows of (table, privileges, role), one per
// table that exists and lacks any, in tablePrivileges' order. It takes no
// arguments (so that any database/sql driver runs it).
func (n *Names) MissingPrivilegesSQL() string {
	var rows []string
	i := 0
	for _, tp := range tablePrivileges {
		for _, p := range tp.privs {
			i++
			rows = append(rows, fmt.Sprintf("(%s, '%s', %d)", quoteLiteral(n.Render("{{table}}"+tp.table)), p, i))
		}
	}
	return `SELECT t, string_agg(p, ', ' ORDER BY i), current_user::text FROM (VALUES ` + strings.Join(rows, ", ") + `) AS c(t, p, i)
		WHERE to_regclass(t) IS NOT NULL AND NOT has_table_privilege(to_regclass(t), p)
		GROUP BY t ORDER BY min(i)`
}

// MissingPrivilege is one row of MissingPrivilegesSQL.
type MissingPrivilege struct {
	Table, Privileges, Role string
}

// PrivilegesError returns nil when missing is empty, else the error of
// CheckPrivileges, prefixed with name ("pgdriver"), naming each table, what
// the role lacks on it, and the GRANTs that give it.
func PrivilegesError(name string, missing []MissingPrivilege) error {
	if len(missing) == 0 {
		return nil
	}
	role := QuoteIdent(missing[0].Role)
	var lacks, grants, dmlTables []string
	for _, m := range missing {
		lacks = append(lacks, m.Table+" ("+m.Privileges+")")
		if strings.HasSuffix(m.Table, "idem_migration") {
			grants = append(grants, "GRANT SELECT ON "+m.Table+" TO "+role)
		} else {
			dmlTables = append(dmlTables, m.Table)
		}
	}
	if len(dmlTables) > 0 {
		grants = append(grants, "GRANT SELECT, INSERT, UPDATE, DELETE ON "+strings.Join(dmlTables, ", ")+" TO "+role)
	}
	return fmt.Errorf("%s: the role %s lacks privileges on idem's tables: %s; as their owner, run %s "+
		"(ALTER DEFAULT PRIVILEGES gives the role the tables later migrations create: README \"Roles and privileges\")",
		name, role, strings.Join(lacks, ", "), strings.Join(grants, "; "))
}

// CheckPrivileges runs MissingPrivilegesSQL through query (which scans its
// rows) and returns PrivilegesError's.
func CheckPrivileges(ctx context.Context, name string, n *Names,
	query func(ctx context.Context, sql string) ([]MissingPrivilege, error)) error {
	missing, err := query(ctx, n.MissingPrivilegesSQL())
	if err != nil {
		return fmt.Errorf("%s: read the role's privileges on idem's tables: %w", name, err)
	}
	return PrivilegesError(name, missing)
}

// CodeInsufficientPrivilege is PostgreSQL's insufficient_privilege.
const CodeInsufficientPrivilege = "42501"

// MigrateDenied returns err, which a migration's DDL returned, with what
// to do when PostgreSQL refused it a privilege: the role is the service's,
// which may not change the schema, and migrations are pending.
func MigrateDenied(err error) error {
	var st interface{ SQLState() string }
	if !errors.As(err, &st) || st.SQLState() != CodeInsufficientPrivilege {
		return err
	}
	return fmt.Errorf("%w (migrations are pending and this role may not run them: run them first as the tables' owner, "+
		"in a deployment step: Migrate, or idemd migrate up; README \"Roles and privileges\")", err)
}
