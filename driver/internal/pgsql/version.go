package pgsql

import (
	"context"
	"fmt"
)

// MinServerVersionNum is the oldest PostgreSQL idem runs on, as
// server_version_num reports it: 12. Migrations 006 and 008 create stored
// generated columns (outbox_pending.lane), which PostgreSQL 12 introduced;
// an older server refuses them with a bare syntax error.
const MinServerVersionNum = 120000

// ServerVersionSQL reads the server's version: server_version_num (an
// integer, 150004 for 15.4) and server_version (for the message). It takes
// no arguments (so that any database/sql driver runs it).
const ServerVersionSQL = `SELECT current_setting('server_version_num')::int, current_setting('server_version')`

// ServerVersionError returns nil when num (server_version_num) is at least
// MinServerVersionNum, else an error, prefixed with driverName, that names
// the server's version and the one idem needs.
func ServerVersionError(driverName string, num int, version string) error {
	if num >= MinServerVersionNum {
		return nil
	}
	return fmt.Errorf("%s: the database server is PostgreSQL %s; idem needs PostgreSQL 12 or later "+
		"(its migrations create stored generated columns, new in PostgreSQL 12): upgrade the server", driverName, version)
}

// CheckServerVersion runs ServerVersionSQL through query (which scans its
// row) and returns ServerVersionError's.
func CheckServerVersion(ctx context.Context, driverName string, query func(ctx context.Context, sql string) (int, string, error)) error {
	num, version, err := query(ctx, ServerVersionSQL)
	if err != nil {
		return fmt.Errorf("%s: read the server's version: %w", driverName, err)
	}
	return ServerVersionError(driverName, num, version)
}
