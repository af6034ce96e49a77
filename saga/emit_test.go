package saga_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/saga"
)

func newEvent(t *testing.T, typ, payload string) event.Envelope {
	t.Helper()
	e, err := event.New(typ, "order-42", []byte(payload))
	if err != nil {
		t.Fatalf("event.New: %v", err)
	}
	return e
}

// The events a step emits get IDs derived from (saga, step, name): the same
// inputs give the same ID, a re-emission is a no-op in the outbox.
func testEmitDeterministic[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	names := []string{"", "a", "b"}
	var emitted []event.Envelope
	run(t, c, id, "step-1", func(ctx context.Context, tx TTx) ([]byte, error) {
		for _, name := range names {
			e, err := c.EmitTx(ctx, tx, id, "step-1", name, newEvent(t, "StockReserved.v1", `{"n":"`+name+`"}`))
			if err != nil {
				return nil, err
			}
			emitted = append(emitted, e)
		}
		return nil, nil
	}, true)

	sagaTime, _ := event.TimeOf(uuid.MustParse(id))
	seen := map[uuid.UUID]bool{}
	for i, e := range emitted {
		want := saga.EventID(id, "step-1", names[i])
		if e.ID != want || e.SagaID != id {
			t.Errorf("event %q: ID %s saga %q; want %s, %q", names[i], e.ID, e.SagaID, want, id)
		}
		if got, ok := event.TimeOf(e.ID); !ok || !got.Equal(sagaTime) {
			t.Errorf("event %q: ID %s carries time %s, %v; want the saga's start %s", names[i], e.ID, got, ok, sagaTime)
		}
		if seen[e.ID] {
			t.Errorf("event %q: ID %s repeats another event's", names[i], e.ID)
		}
		seen[e.ID] = true
		if got := f.outbox(t, e.ID); len(got) != 1 || got[0] != `{"n":"`+names[i]+`"}` {
			t.Errorf("outbox rows of %s = %q; want the one event", e.ID, got)
		}
	}
	if emitted[0].ID != event.StepID(id, "step-1") || emitted[1].ID != event.DerivedID(event.StepID(id, "step-1"), "a") {
		t.Errorf("IDs %s, %s are not StepID and DerivedID(StepID, name)", emitted[0].ID, emitted[1].ID)
	}
	if saga.EventID(id, "step-2", "a") == emitted[1].ID || saga.EventID(newSagaID(t), "step-1", "a") == emitted[1].ID {
		t.Error("another step or saga gives the same event ID")
	}

	// Emitting again (new envelope, new payload): nothing new is stored.
	tx := f.begin(t)
	again, err := c.EmitTx(ctx, tx, id, "step-1", "a", newEvent(t, "StockReserved.v1", `{"n":"again"}`))
	if err != nil || again.ID != emitted[1].ID {
		t.Fatalf("re-Emit = %s, %v; want ID %s", again.ID, err, emitted[1].ID)
	}
	wrong := newEvent(t, "StockReserved.v1", `{}`)
	wrong.SagaID = "another-saga"
	if _, err := c.EmitTx(ctx, tx, id, "step-1", "c", wrong); err == nil {
		t.Error("Emit of an envelope of another saga succeeded")
	}
	f.rollback(t, tx)
	tx = f.begin(t)
	if _, err := c.EmitTx(ctx, tx, id, "step-1", "a", newEvent(t, "StockReserved.v1", `{"n":"again"}`)); err != nil {
		t.Fatal(err)
	}
	f.commit(t, tx)
	if got := f.outbox(t, emitted[1].ID); len(got) != 1 || got[0] != `{"n":"a"}` {
		t.Errorf("outbox rows of %s after a re-emission = %q; want the first event only", emitted[1].ID, got)
	}

	// A saga ID that is not a UUIDv7 still gives deterministic, valid IDs.
	plain := "order-42-saga"
	f.start(t, c, plain)
	for range 2 {
		tx := f.begin(t)
		e, err := c.EmitTx(ctx, tx, plain, "step-1", "", newEvent(t, "StockReserved.v1", `{}`))
		if err != nil || e.ID != event.StepID(plain, "step-1") {
			t.Fatalf("Emit for saga %q = %s, %v", plain, e.ID, err)
		}
		f.commit(t, tx)
		if got := f.outbox(t, e.ID); len(got) != 1 {
			t.Errorf("outbox rows of %s = %d; want 1", e.ID, len(got))
		}
	}
}

// A step that emits, rolls back (its process died before COMMIT) and runs
// again emits the same IDs: the retry's event is the one stored, once, and a
// redelivery of the committed step emits nothing.
func testEmitRetried[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	var ids []uuid.UUID
	step := func(ctx context.Context, tx TTx) ([]byte, error) {
		if err := f.effect(ctx, tx, id, "step-1"); err != nil {
			return nil, err
		}
		e, err := c.EmitTx(ctx, tx, id, "step-1", "", newEvent(t, "PaymentRequested.v1", `{"amount":"10.0000"}`))
		if err != nil {
			return nil, err
		}
		ids = append(ids, e.ID)
		return e.ID[:], nil
	}
	tx := f.begin(t)
	if _, ran, err := c.StepTx(ctx, tx, id, "step-1", step); err != nil || !ran {
		t.Fatalf("Step = %v, %v", ran, err)
	}
	f.rollback(t, tx)
	if got := f.outbox(t, ids[0]); len(got) != 0 {
		t.Fatalf("the rolled-back step's event is in the outbox: %q", got)
	}
	res := run(t, c, id, "step-1", step, true)
	run(t, c, id, "step-1", step, false)
	if len(ids) != 2 || ids[0] != ids[1] || string(res) != string(ids[0][:]) {
		t.Fatalf("the attempts emitted %v (result %x); want the same ID twice", ids, res)
	}
	if got := f.outbox(t, ids[0]); len(got) != 1 {
		t.Errorf("outbox rows of %s = %d; want 1", ids[0], len(got))
	}
	f.mustEffects(t, id, "step-1", 1)
}

// A step's function that emits two different events under one name gets
// ErrEmitConflict for the second (the outbox would keep only the first);
// emitting the same event again under its name is a no-op.
func testEmitConflict[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	first := newEvent(t, "StockReserved.v1", `{"a":1}`)
	_, _, err := c.Step(t.Context(), id, "step-1", func(ctx context.Context, tx TTx) ([]byte, error) {
		if _, err := c.EmitTx(ctx, tx, id, "step-1", "", first); err != nil {
			return nil, err
		}
		if _, err := c.EmitTx(ctx, tx, id, "step-1", "", first); err != nil {
			return nil, fmt.Errorf("the same event again: %w", err)
		}
		_, err := c.EmitTx(ctx, tx, id, "step-1", "", newEvent(t, "InvoiceRequested.v1", `{"b":2}`))
		return nil, err
	})
	if !errors.Is(err, saga.ErrEmitConflict) {
		t.Fatalf("Step emitting two events under one name: %v; want ErrEmitConflict", err)
	}
	if got := f.outbox(t, saga.EventID(id, "step-1", "")); len(got) != 0 {
		t.Errorf("outbox holds %q after the step failed; want nothing", got)
	}
	f.mustLog(t, id)

	// Given their own names, both are stored.
	run(t, c, id, "step-1", func(ctx context.Context, tx TTx) ([]byte, error) {
		if _, err := c.EmitTx(ctx, tx, id, "step-1", "stock", first); err != nil {
			return nil, err
		}
		_, err := c.EmitTx(ctx, tx, id, "step-1", "invoice", newEvent(t, "InvoiceRequested.v1", `{"b":2}`))
		return nil, err
	}, true)
	for _, name := range []string{"stock", "invoice"} {
		if got := f.outbox(t, saga.EventID(id, "step-1", name)); len(got) != 1 {
			t.Errorf("outbox rows of %q: %q; want one", name, got)
		}
	}
}
