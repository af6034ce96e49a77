package pgsql

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Isolation levels as current_setting reports them.
const (
	// DefaultIsolationSQL reads the session's default isolation level: the
	// level of the implicit transactions of pgdriver's uncontended claim.
	DefaultIsolationSQL = `SELECT current_setting('default_transaction_isolation')`
	// TxIsolationSQL reads the current transaction's isolation level.
	TxIsolationSQL = `SELECT current_setting('transaction_isolation')`
)

// IsolationCheck remembers that the isolation level of the driver's
// sessions was found to be READ COMMITTED, which the claims need: the
// record claim and the relay's lanes read with a statement that follows
// the lock's, and count on that statement's snapshot being taken after the
// lock was granted. Under REPEATABLE READ or SERIALIZABLE the transaction's
// snapshot is the one of its first statement, taken before the lock: a
// duplicate could miss the record the lock's previous holder committed and
// run the command again (the record's unique key would then refuse the
// second record and roll back its writes, but not undo what the handler
// did outside the database), and two relays could publish a row twice.
type IsolationCheck struct{ ok atomic.Bool }

// Check returns nil once a level read by query was READ COMMITTED; until
// then it runs query and returns an error that says what to change when
// the level is another one. driverName prefixes the errors.
func (c *IsolationCheck) Check(ctx context.Context, driverName string, query func(context.Context) (string, error)) error {
	if c.ok.Load() {
		return nil
	}
	level, err := query(ctx)
	if err != nil {
		return fmt.Errorf("%s: read the isolation level: %w", driverName, err)
	}
	if err := IsolationError(driverName, level); err != nil {
		return err
	}
	c.ok.Store(true)
	return nil
}

// IsolationError returns nil for READ COMMITTED and, for another level, an
// error that says what to change.
func IsolationError(driverName, level string) error {
	if level == "read committed" {
		return nil
	}
	return fmt.Errorf("%s: the isolation level of idem's transactions is %q; idem's claims need read committed "+
		"(PostgreSQL's default), as a claim reads the record with a snapshot taken after the key's lock: "+
		"reset default_transaction_isolation for the role or database the pool connects with "+
		"(or in its connection settings)", driverName, level)
}
