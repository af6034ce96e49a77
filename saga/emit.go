package saga

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/txnil"
	"github.com/idemkit/idem/outbox"
)

// EventID returns the ID of the event name that step stepName of saga sagaID
// emits: event.StepID(sagaID, stepName) for name "", and
// event.DerivedID(event.StepID(sagaID, stepName), name) otherwise. The same
// inputs always give the same ID, so a step that runs again (its transaction
// rolled back, or its process died before COMMIT) emits identical IDs, and
// the outbox (UNIQUE event_id) and every downstream inbox drop the repeat.
// A step that emits several events gives each its own name.
func EventID(sagaID, stepName, name string) uuid.UUID {
	id := event.StepID(sagaID, stepName)
	if name == "" {
		return id
	}
	return event.DerivedID(id, name)
}

// EmitTx stores env in the outbox inside the caller's transaction tx (the
// transaction of step stepName), with its ID replaced by
// EventID(sagaID, stepName, name) and its SagaID set to sagaID, and returns
// the envelope as stored. Re-emitting the same event (same saga, step and
// name) is a no-op in the outbox: the first stored version is the one
// published. Call it from the step's function, so the event is published if
// and only if the step commits.
//
// env.SagaID must be empty or sagaID. Called with the context that StepTx
// or Step passed to the step's function, EmitTx refuses a second, different
// event (type, key or payload) under a name the function already used, with
// ErrEmitConflict: the outbox would keep only the first.
func (c *Coordinator[TTx]) EmitTx(ctx context.Context, tx TTx, sagaID, stepName, name string, env event.Envelope) (event.Envelope, error) {
	if err := checkName("saga ID", sagaID); err != nil {
		return env, fmt.Errorf("saga: emit %s: %w", env.Type, err)
	}
	// A compensation emits under CompensationName(step): the prefix does
	// not count towards the step name's length.
	if err := checkName("step name", strings.TrimPrefix(stepName, CompensationPrefix)); err != nil {
		return env, fmt.Errorf("saga %q: emit %s: %w", sagaID, env.Type, err)
	}
	if env.SagaID != "" && env.SagaID != sagaID {
		return env, fmt.Errorf("saga %q: emit %s: the envelope belongs to saga %q", sagaID, env.Type, env.SagaID)
	}
	if txnil.Is(tx) {
		return env, nilTxError(sagaID, "step "+stepName+": emit "+env.Type)
	}
	env.ID = EventID(sagaID, stepName, name)
	env.SagaID = sagaID
	if e, ok := ctx.Value(emitsKey{}).(*emits); ok && e.sagaID == sagaID && e.step == stepName {
		if err := e.add(env, name); err != nil {
			return env, fmt.Errorf("saga %q: step %q: %w", sagaID, stepName, err)
		}
	}
	if err := outbox.EnqueueTx(ctx, c.drv, tx, env); err != nil {
		return env, fmt.Errorf("saga %q: step %q: emit %s: %w", sagaID, stepName, env.Type, err)
	}
	return env, nil
}

// emits are the events one run of a step's function emitted, by ID.
type emits struct {
	sagaID, step string
	mu           sync.Mutex // a function may emit from several goroutines
	byID         map[uuid.UUID]event.Envelope
}

// add records env, emitted under name, or refuses it when another event
// was emitted under that name.
func (e *emits) add(env event.Envelope, name string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	prev, seen := e.byID[env.ID]
	if !seen {
		e.byID[env.ID] = env
		return nil
	}
	if prev.Type != env.Type || prev.Key != env.Key || !bytes.Equal(prev.Payload, env.Payload) {
		return fmt.Errorf("emit %s under name %q, already used by %s: %w", env.Type, name, prev.Type, ErrEmitConflict)
	}
	return nil
}

type emitsKey struct{}

// withEmits returns ctx for one run of step's function.
func withEmits(ctx context.Context, sagaID, step string) context.Context {
	return context.WithValue(ctx, emitsKey{}, &emits{sagaID: sagaID, step: step, byID: map[uuid.UUID]event.Envelope{}})
}
