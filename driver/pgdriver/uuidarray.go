package pgdriver

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// uuidArray is a uuid[] argument. pgx encodes a []pgtype.UUID through
// reflection, which copies every element into an interface: one allocation
// per id (500 for a poll of 500 events; see BenchmarkUUIDArrayEncode). A
// pgtype.FlatArray of pointers into one slice of values encodes without
// them, and pgx knows its type from the Go type alone, as the simple
// protocol and QueryExecModeExec need.
type uuidArray = pgtype.FlatArray[*pgtype.UUID]

// newUUIDArray returns ids as a uuidArray: two allocations whatever their
// number.
func newUUIDArray(ids []uuid.UUID) uuidArray {
	return uuidArrayOf(len(ids), func(i int) uuid.UUID { return ids[i] })
}

// uuidArrayOf returns the n ids id(0) ... id(n-1) as a uuidArray, in two
// allocations.
func uuidArrayOf(n int, id func(i int) uuid.UUID) uuidArray {
	vals := make([]pgtype.UUID, n)
	a := make(uuidArray, n)
	for i := range n {
		vals[i] = pgtype.UUID{Bytes: id(i), Valid: true}
		a[i] = &vals[i]
	}
	return a
}
