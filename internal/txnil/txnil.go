// Package txnil tells whether a caller's transaction is nil, for the ...Tx
// entry points of idem's packages, which join a transaction they are given
// and must refuse none at all, and for the constructors (saga.New,
// inbox.New, outbox.NewRelay, idemhttp.New, cleanup.New), which refuse a
// nil driver, also a nil *Driver left by an Open whose error was ignored.
package txnil

import "reflect"

// Is reports whether tx is nil: a nil interface (pgx.Tx) or a nil pointer
// (*sql.Tx). A driver given one would panic on PostgreSQL, or (database/sql
// on SQLite, whose prepared statements can run on the database) write
// outside any transaction, committed on its own whatever becomes of the
// caller's. It allocates nothing.
func Is[TTx any](tx TTx) bool {
	v := reflect.ValueOf(any(tx))
	switch v.Kind() {
	case reflect.Invalid:
		return true
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}
