package inbox

import (
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// ErrNilEventID: an event carries the zero UUID. It is rejected rather than
// deduplicated: every event whose ID was never set would share it, and all
// but the first would be silently skipped.
var ErrNilEventID = errors.New("inbox: event ID is the nil UUID")

// errNilTx is the error of ProcessTx, ProcessBatchTx and ProcessBulkTx
// given a nil transaction: on PostgreSQL the driver would panic on it.
var errNilTx = errors.New("inbox: nil transaction (ProcessTx, ProcessBatchTx and ProcessBulkTx record the events in the caller's transaction: pass the one of the handler's effect)")

// EventError says which event a batch failed on. The handler's error (or
// ErrNilEventID) is in Err; errors.Is and errors.As see through EventError.
// Nothing of the batch was committed. An EventError wrapping the context's
// error (context.Canceled, context.DeadlineExceeded) reports a batch cut
// short, not a faulty event.
type EventError struct {
	// ID is the event's ID.
	ID uuid.UUID
	// Index is the event's position in the slice given to ProcessBatch (0
	// for Process).
	Index int
	// Err is the cause.
	Err error
}

func (e *EventError) Error() string {
	return fmt.Sprintf("inbox: event %d (%s): %v", e.Index, e.ID, e.Err)
}

// Unwrap returns the cause.
func (e *EventError) Unwrap() error { return e.Err }
