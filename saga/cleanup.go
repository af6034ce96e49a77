package saga

import (
	"context"
	"time"

	"github.com/idemkit/idem/driver"
)

// DeleteFinished deletes at most limit sagas that finished (Completed or
// Compensated) before before, with their steps, in one bounded statement,
// and returns how many it deleted. Running, compensating and failed sagas
// are never deleted. It has the signature of cleanup.Rule.Delete, so the
// cleaner sweeps finished sagas with
//
//	cleanup.Rule{Table: "saga", TTL: 7 * 24 * time.Hour, Delete: saga.DeleteFinished}
//
// Keep finished sagas at least as long as the events that drive them can be
// redelivered (the inbox retention): a redelivered event of a deleted saga
// finds no saga (ErrNotFound) instead of its recorded step.
func DeleteFinished(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int, error) {
	return ex.SagaDeleteFinishedBefore(ctx, before, limit)
}
