package uniq

import (
	"context"
	"fmt"
)

// CreateOrGet runs create. When create fails with a unique violation of c
// (see Is), the row already exists, typically created by a concurrent or
// earlier request for the same business operation: CreateOrGet runs get and
// returns the existing row with created=false. Any other error of create is
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
// Inside a PostgreSQL transaction, create must run in a savepoint (see
// SavepointTx and the package documentation), or get fails on the aborted
// transaction.
func CreateOrGet[T any](ctx context.Context, c Constraint,
	create, get func(ctx context.Context) (T, error),
) (v T, created bool, err error) {
	v, err = create(ctx)
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
