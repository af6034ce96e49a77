package saga

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemkit/idem/event"
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
// env.SagaID must be empty or sagaID.
func (c *Coordinator[TTx]) EmitTx(ctx context.Context, tx TTx, sagaID, stepName, name string, env event.Envelope) (event.Envelope, error) {
	if env.SagaID != "" && env.SagaID != sagaID {
		return env, fmt.Errorf("saga %q: emit %s: the envelope belongs to saga %q", sagaID, env.Type, env.SagaID)
	}
	env.ID = EventID(sagaID, stepName, name)
	env.SagaID = sagaID
	if err := outbox.EnqueueTx(ctx, c.drv, tx, env); err != nil {
		return env, fmt.Errorf("saga %q: step %q: emit %s: %w", sagaID, stepName, env.Type, err)
	}
	return env, nil
}
