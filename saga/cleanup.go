package saga

import (
	"context"
	"time"

	"github.com/idemkit/idem/driver"
)

// DeleteFinished deletes at most limit sagas that finished (Completed or
// Compensated) before before, with their steps, in one bounded statement,
// and returns how many it deleted. Running, compensating and failed sagas
// are never deleted.
//
// The cleaner of package cleanup already sweeps finished sagas with this
// statement (cleanup.Config.Sagas: 72h after they finished by default, on
// the cleaner's schedule, one replica at a time), so most applications never
// call DeleteFinished. It is for a job of one's own. Each call starts from
// the oldest finished saga, where the cleaner's batches each resume after
// the last saga the batch before deleted (driver.DeleteResult): on
// PostgreSQL, while another transaction holds an old snapshot, each call
// reads again the index entries of every saga deleted since. As a
// cleanup.Rule:
//
//	Delete: func(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int, error) {
//		return saga.DeleteFinished(ctx, ex, before, limit)
//	}
//
// Keep finished sagas at least as long as the events that drive them can be
// redelivered (the inbox retention): a redelivered event of a deleted saga
// finds no saga (ErrNotFound) instead of its recorded step, and an event
// that starts the saga creates it anew.
func DeleteFinished(ctx context.Context, ex driver.SagaExecutor, before time.Time, limit int) (int, error) {
	res, err := ex.SagaDeleteFinishedBefore(ctx, &driver.SagaDeleteFinishedBeforeParams{Before: before, Limit: limit})
	return res.Deleted, err
}
