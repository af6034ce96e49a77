package inbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/inbox"
)

// noPanic runs fn and turns a panic into an error.
func noPanic(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return fn()
}

// ProcessTx, ProcessBatchTx and ProcessBulkTx given a nil transaction (one
// not threaded through to them) refuse it with an error that says so, call
// no handler and record nothing. On PostgreSQL they used to panic with a
// nil pointer dereference in the driver.
func testNilTxRefused[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	ib := f.inbox(t, consumer)
	var none TTx
	id := newID(t)
	called := false
	check := func(what string, err error) {
		t.Helper()
		if err == nil || strings.HasPrefix(err.Error(), "panic:") || !strings.Contains(err.Error(), "nil transaction") {
			t.Errorf("%s with a nil transaction: %v; want an error saying the transaction is nil", what, err)
		}
	}
	check("ProcessTx", noPanic(func() error {
		_, err := ib.ProcessTx(ctx, none, id, func(context.Context, TTx) error { called = true; return nil })
		return err
	}))
	check("ProcessBatchTx", noPanic(func() error {
		_, err := ib.ProcessBatchTx(ctx, none, events(id), func(context.Context, TTx, inbox.Event) error { called = true; return nil })
		return err
	}))
	check("ProcessBulkTx", noPanic(func() error {
		_, err := ib.ProcessBulkTx(ctx, none, events(id), func(context.Context, TTx, []inbox.Event) error { called = true; return nil })
		return err
	}))
	if called {
		t.Error("a handler ran without a transaction")
	}
	f.mustProcessed(t, consumer, id, 0)
	if applied, err := ib.Process(ctx, id, f.apply(consumer, id)); err != nil || !applied {
		t.Errorf("Process after the refused calls = %v, %v; want the event applied", applied, err)
	}
}
