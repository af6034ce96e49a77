package main

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/internal/pgbouncer"
)

// startPgBouncer starts PgBouncer with pool_mode = transaction and at most
// size server connections in front of dsn's server (-pgbouncer). PgBouncer
// passes no search_path (nor synchronous_commit) given at connection
// start, so each server connection sets them itself (connect_query):
// schema, and syncCommit unless empty. application_name is one of the
// parameters PgBouncer passes on: a client's is set on the server
// connection it is given.
func startPgBouncer(ctx context.Context, dsn, schema, syncCommit string, size int) (*pgbouncer.Process, error) {
	q := "SET search_path = " + schema
	if syncCommit != "" {
		q += "; SET synchronous_commit = " + syncCommit
	}
	p, err := pgbouncer.Start(ctx, pgbouncer.Config{DSN: dsn, PoolSize: size, ConnectQuery: q})
	if err != nil {
		return nil, fmt.Errorf("-pgbouncer: %w", err)
	}
	return p, nil
}
