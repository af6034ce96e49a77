package saga_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/saga"
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

// Every ...Tx method given a nil transaction (one not threaded through to
// it) refuses it with an error that says so, runs no step function and
// changes nothing. On PostgreSQL they used to panic with a nil pointer
// dereference, deep in the driver.
func testNilTxRefused[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	var none TTx
	id := newSagaID(t)
	called := false
	fn := func(context.Context, TTx) ([]byte, error) {
		called = true
		return nil, nil
	}
	ev, err := event.New("Nil.v1", "k", map[string]string{})
	if err != nil {
		t.Fatalf("event.New: %v", err)
	}
	check := func(what string, err error) {
		t.Helper()
		if err == nil || strings.HasPrefix(err.Error(), "panic:") || !strings.Contains(err.Error(), "nil transaction") {
			t.Errorf("%s with a nil transaction: %v; want an error saying the transaction is nil", what, err)
		}
	}
	check("StartTx", noPanic(func() error { _, _, err := c.StartTx(ctx, none, id, "order", nil); return err }))
	if _, err := c.Get(ctx, id); err == nil {
		t.Errorf("StartTx with a nil transaction stored the saga")
	}
	f.start(t, c, id)
	check("StepTx", noPanic(func() error { _, _, err := c.StepTx(ctx, none, id, "step-1", fn); return err }))
	check("CompleteTx", noPanic(func() error { return c.CompleteTx(ctx, none, id) }))
	check("AbortTx", noPanic(func() error { return c.AbortTx(ctx, none, id) }))
	check("GetTx", noPanic(func() error { _, err := c.GetTx(ctx, none, id); return err }))
	check("EmitTx", noPanic(func() error { _, err := c.EmitTx(ctx, none, id, "step-1", "", ev); return err }))
	if called {
		t.Error("StepTx with a nil transaction ran the step's function")
	}
	s := mustGet(t, c, id)
	if s.State != saga.Running || len(s.Steps) != 0 {
		t.Errorf("after the refused calls the saga is %s with steps %v; want running without steps", s.State, stepNames(s))
	}
	if got := f.outbox(t, saga.EventID(id, "step-1", "")); len(got) != 0 {
		t.Errorf("EmitTx with a nil transaction stored %v", got)
	}
}
