// Package txbegin lets a caller that runs transactions on a context
// detached from its own (so that a transaction under way finishes during a
// shutdown) still stop a Begin that is waiting: for a connection of an
// exhausted pool, or for a server that does not answer.
//
// The caller marks its detached context with WithStop; Begin, used by the
// code that opens the transaction, cancels the Begin when the stop context
// ends before the Begin returns, and only then. database/sql binds a
// transaction to the context of its BeginTx, so the transaction keeps a
// context of its own that is cancelled only by the returned end function.
package txbegin

import (
	"context"
	"fmt"
)

type stopKey struct{}

// WithStop returns work carrying stop: a Begin run by Begin under the
// returned context ends when stop ends.
func WithStop(work, stop context.Context) context.Context {
	return context.WithValue(work, stopKey{}, stop)
}

// Stop returns the stop context ctx carries (WithStop) and true, or nil
// and false when it carries none: the context whose end means "shut down
// now" for work that runs on a detached ctx. ctx may still end on its own
// before (a deadline derived from it).
func Stop(ctx context.Context) (context.Context, bool) {
	stop, ok := ctx.Value(stopKey{}).(context.Context)
	return stop, ok
}

// Begin calls begin. If ctx carries a stop context (WithStop) and it ends
// before begin returns, begin's context is cancelled, the transaction (if
// begin made one anyway) is rolled back with rollback, and Begin returns an
// error wrapping stop's. end must be called once the transaction is over:
// it releases the context the transaction was begun on.
func Begin[T any](ctx context.Context, begin func(context.Context) (T, error), rollback func(T)) (tx T, end func(), err error) {
	stop, ok := ctx.Value(stopKey{}).(context.Context)
	if !ok {
		tx, err = begin(ctx)
		return tx, func() {}, err
	}
	txCtx, cancel := context.WithCancel(ctx)
	unregister := context.AfterFunc(stop, cancel)
	tx, err = begin(txCtx)
	if !unregister() {
		// stop ended while begin ran: its transaction, if any, is being
		// cancelled; nothing may run in it.
		if err == nil {
			rollback(tx)
		}
		cancel()
		var zero T
		return zero, func() {}, fmt.Errorf("begin: stopped: %w", context.Cause(stop))
	}
	if err != nil {
		cancel()
		return tx, func() {}, err
	}
	return tx, cancel, nil
}
