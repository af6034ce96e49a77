package uniq

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CreateOrGet runs create. When create fails with a unique violation of c
// (see Is), the row already exists, typically created by a concurrent or
// earlier request for the same business operation: CreateOrGet runs get and
// returns the existing row with created=false. It may hold other details
// than create was given (another operation took the key): compare them
// before answering with it. Any other error of create is
// returned as it is, and an error of get is returned wrapped.
//
// On PostgreSQL c must have a Name: PostgreSQL reports a unique violation
// by constraint name only, so without one no duplicate could ever be
// recognised. A PostgreSQL unique violation checked against a Constraint
// with an empty Name is returned wrapped in an error saying so
// ("uniq: Constraint.Name is required on PostgreSQL ..."), at the first
// duplicate, rather than passed on as an ordinary error; SQLite, which
// Table and Columns suffice for, needs no Name.
//
// Inside a PostgreSQL transaction, create must run in a savepoint, or get
// fails on the aborted transaction: CreateOrGetTx (pgx) and
// CreateOrGetSQLTx (database/sql) take it for you.
func CreateOrGet[T any](ctx context.Context, c Constraint,
	create, get func(ctx context.Context) (T, error),
) (v T, created bool, err error) {
	v, err = create(ctx)
	return resolve(ctx, c, v, err, get)
}

// CreateOrGetTx is CreateOrGet inside a pgx transaction tx that the caller
// does not end, such as an idemhttp ModeTx handler's
// (idemhttp.TxFromContext[pgx.Tx]): it takes the savepoint itself. create
// runs in a savepoint of tx (see SavepointTx) and receives the savepoint's
// transaction; get runs on tx. The result is CreateOrGet's:
//
//   - create succeeds: the savepoint is released, its writes are part of
//     tx, created=true.
//   - create fails with a unique violation of c: its writes are rolled
//     back, get reads the existing row in tx, created=false; an error of
//     get is returned wrapped.
//   - create fails otherwise (another constraint, any other error, a
//     PostgreSQL violation checked against a Constraint without Name, as
//     for CreateOrGet): its error is returned as it is, get does not run,
//     and create's writes are rolled back to the savepoint. tx stays
//     usable: the caller decides whether to go on and commit or to fail
//     the request.
//
// A panic in create rolls the savepoint back and goes on. When the
// savepoint itself cannot be taken, released or rolled back to (a broken
// connection, a transaction already aborted), that error is returned,
// joined with create's, and get does not run: tx is then not usable. A nil
// tx (idemhttp.TxFromContext found none) is refused with an error before
// create runs; so it is by CreateOrGetSQLTx, SavepointTx and
// SavepointSQLTx.
func CreateOrGetTx[T any](ctx context.Context, tx pgx.Tx, c Constraint,
	create, get func(ctx context.Context, tx pgx.Tx) (T, error),
) (v T, created bool, err error) {
	createErr, spErr := pgSavepoint(ctx, tx, func(sp pgx.Tx) (err error) {
		v, err = create(ctx, sp)
		return err
	})
	if spErr != nil {
		var zero T
		return zero, false, joinSavepoint(createErr, spErr)
	}
	return resolve(ctx, c, v, createErr, func(ctx context.Context) (T, error) { return get(ctx, tx) })
}

// CreateOrGetSQLTx is CreateOrGetTx for a database/sql transaction (an
// idemhttp ModeTx handler's with pgsqldriver or sqlitedriver:
// idemhttp.TxFromContext[*sql.Tx]), on PostgreSQL and SQLite: create runs
// in a savepoint of tx (see SavepointSQLTx), get on tx, with the same
// results. Both receive tx itself. On SQLite a lone INSERT would not need
// the savepoint; it is taken anyway, so that a create writing anything
// before its INSERT leaves nothing behind when it loses.
func CreateOrGetSQLTx[T any](ctx context.Context, tx *sql.Tx, c Constraint,
	create, get func(ctx context.Context, tx *sql.Tx) (T, error),
) (v T, created bool, err error) {
	createErr, spErr := sqlSavepoint(ctx, tx, func(tx *sql.Tx) (err error) {
		v, err = create(ctx, tx)
		return err
	})
	if spErr != nil {
		var zero T
		return zero, false, joinSavepoint(createErr, spErr)
	}
	return resolve(ctx, c, v, createErr, func(ctx context.Context) (T, error) { return get(ctx, tx) })
}

// resolve is CreateOrGet once create returned v and err.
func resolve[T any](ctx context.Context, c Constraint, v T, err error,
	get func(ctx context.Context) (T, error),
) (T, bool, error) {
	if err == nil {
		return v, true, nil
	}
	var zero T
	if !Is(err, c) {
		if c.Name == "" && isPGUniqueViolation(err) {
			return zero, false, fmt.Errorf("uniq: Constraint.Name is required on PostgreSQL (%s): PostgreSQL reports a unique violation by constraint name only, so this duplicate cannot be recognised: %w", c.label(), err)
		}
		return zero, false, err
	}
	v, err = get(ctx)
	if err != nil {
		return zero, false, fmt.Errorf("uniq: %s violated but the existing row could not be read: %w", c.label(), err)
	}
	return v, false, nil
}

// label names c in error messages.
func (c Constraint) label() string {
	if c.Name != "" {
		return c.Name
	}
	return fmt.Sprintf("unique %s%v", c.Table, c.Columns)
}
