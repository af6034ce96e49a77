package saga

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/txnil"
)

// Coordinator runs the steps and compensations of sagas stored through one
// driver. TTx is the driver's transaction type (pgx.Tx, *sql.Tx). It keeps no
// saga in memory: every call reads and writes the database, so any replica,
// and a restarted process, continues a saga where it stands. Build one with
// New; it is safe for concurrent use.
type Coordinator[TTx any] struct {
	drv driver.SagaDriver[TTx]
	cfg Config
}

// New returns a Coordinator storing sagas through drv, whose migrations must
// have run. cfg may be nil.
func New[TTx any](drv driver.SagaDriver[TTx], cfg *Config) (*Coordinator[TTx], error) {
	if txnil.Is(drv) { // nil, or a nil *Driver from an Open whose error was ignored
		return nil, errors.New("saga: nil driver")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Coordinator[TTx]{drv: drv, cfg: c}, nil
}

// StartTx creates the saga sagaID of type sagaType with its input data, Running,
// in the caller's transaction tx, unless it exists: then it returns the
// stored saga (state, data and all, as the first StartTx wrote them) and
// created false. Call it in the transaction of the saga's first step, so a
// redelivery of the event that starts the saga starts it once.
//
// It fails with ErrTypeMismatch when the saga exists with another type.
// Saga IDs should be UUIDv7 text (the String of an ID from event.NewID):
// the IDs of the events its steps emit (EventID) then sort by the saga's
// start.
func (c *Coordinator[TTx]) StartTx(ctx context.Context, tx TTx, sagaID, sagaType string, data []byte) (s *Saga, created bool, err error) {
	if err := checkName("saga ID", sagaID); err != nil {
		return nil, false, err
	}
	if err := checkName("saga type", sagaType); err != nil {
		return nil, false, err
	}
	if txnil.Is(tx) {
		return nil, false, nilTxError(sagaID, "start")
	}
	now := c.cfg.Now()
	stored, created, err := c.drv.SagasTx(tx).SagaCreate(ctx, &driver.Saga{
		ID: sagaID, Type: sagaType, State: driver.SagaRunning, Data: data, CreatedAt: now, UpdatedAt: now,
	})
	if err != nil {
		return nil, false, fmt.Errorf("saga %q: start: %w", sagaID, err)
	}
	if stored.Type != sagaType {
		return nil, false, fmt.Errorf("saga %q: start as %q: %w (%q)", sagaID, sagaType, ErrTypeMismatch, stored.Type)
	}
	return fromDriver(stored, nil), created, nil
}

// Get reads the saga and its recorded steps. ErrNotFound if there is none.
func (c *Coordinator[TTx]) Get(ctx context.Context, sagaID string) (*Saga, error) {
	return c.get(ctx, c.drv.Sagas(), sagaID)
}

// GetTx is Get inside the caller's transaction: it sees what tx wrote.
func (c *Coordinator[TTx]) GetTx(ctx context.Context, tx TTx, sagaID string) (*Saga, error) {
	if txnil.Is(tx) {
		return nil, nilTxError(sagaID, "get")
	}
	return c.get(ctx, c.drv.SagasTx(tx), sagaID)
}

func (c *Coordinator[TTx]) get(ctx context.Context, ex driver.SagaExecutor, sagaID string) (*Saga, error) {
	if err := checkName("saga ID", sagaID); err != nil {
		return nil, fmt.Errorf("saga: get: %w", err)
	}
	s, err := ex.SagaGet(ctx, &driver.SagaGetParams{SagaID: sagaID})
	if err != nil {
		return nil, wrapErr(sagaID, "get", err)
	}
	steps, err := ex.SagaSteps(ctx, &driver.SagaStepsParams{SagaID: sagaID})
	if err != nil {
		return nil, wrapErr(sagaID, "get", err)
	}
	if steps == nil {
		steps = []driver.SagaStep{}
	}
	return fromDriver(s, steps), nil
}

// List returns at most limit sagas in one of states, least recently updated
// first. A recovery loop lists Compensating and Failed sagas at start-up
// (and periodically) and calls Compensate for each, so a compensation
// interrupted by a crash is finished.
//
// A saga the loop leaves alone (a Failed one waiting for an operator) is
// not updated, so it stays first: once limit of them are waiting, List
// returns them only, round after round. Page with ListAfter instead.
//
// Only a change of state updates a saga, not its steps: a Running saga's
// UpdatedAt is its start, and List(ctx, limit, Running) returns the oldest
// running sagas first, the candidates for a saga stuck because the event
// of its next step was lost (see ExampleCoordinator_List).
//
// No state, an unknown state or a limit under 1 is an error (see
// ListAfter).
func (c *Coordinator[TTx]) List(ctx context.Context, limit int, states ...State) ([]*Saga, error) {
	return c.ListAfter(ctx, limit, nil, states...)
}

// ListAfter is List's next page: the sagas after after (the last of the
// previous page) in List's order, least recently updated first, then by
// ID. A nil after is the first page. A short page is the last: start
// again from nil.
//
// It fails, rather than return an empty page, when limit is not positive,
// when no state is given or one is not one of the five, and when after has
// no ID or no UpdatedAt (pass the last saga of the previous page as
// returned, not one built from its ID).
func (c *Coordinator[TTx]) ListAfter(ctx context.Context, limit int, after *Saga, states ...State) ([]*Saga, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("saga: list: limit %d must be positive", limit)
	}
	if len(states) == 0 {
		return nil, errors.New("saga: list: no state given")
	}
	ss := make([]string, len(states))
	for i, s := range states {
		if !driver.ValidSagaState(string(s)) {
			return nil, fmt.Errorf("saga: list: unknown state %q", s)
		}
		ss[i] = string(s)
	}
	p := &driver.SagaListParams{States: ss, Limit: limit}
	if after != nil {
		if after.ID == "" || after.UpdatedAt.IsZero() {
			return nil, fmt.Errorf("saga: list: after (ID %q, UpdatedAt %s) is not a listed saga: it needs both", after.ID, after.UpdatedAt)
		}
		p.AfterID, p.AfterUpdatedAt = after.ID, after.UpdatedAt
	}
	list, err := c.drv.Sagas().SagaList(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("saga: list: %w", err)
	}
	out := make([]*Saga, len(list))
	for i := range list {
		out[i] = fromDriver(&list[i], nil)
	}
	return out, nil
}

// CompleteTx marks the saga Completed in the caller's transaction tx, after
// its last forward step (usually in the same transaction). Completing a
// completed saga is a no-op; a saga that is compensating, compensated or
// failed gives a *StateError.
//
// On PostgreSQL, CompleteTx (like AbortTx and Compensate) waits for the other
// open transactions that record a step of the saga. A duplicate of a step
// that tx recorded (a second event, another consumer) waits for tx without
// holding it up, and so does a transaction that only went through steps
// recorded before (a redelivery). Two transactions that both ran a step of one saga and then
// both call CompleteTx deadlock; the database aborts one of them, whose
// caller rolls back and retries (a redelivery), which is always safe.
func (c *Coordinator[TTx]) CompleteTx(ctx context.Context, tx TTx, sagaID string) error {
	if txnil.Is(tx) {
		return nilTxError(sagaID, "complete")
	}
	return c.setState(ctx, c.drv.SagasTx(tx), sagaID, "complete", []State{Running}, Completed, Completed)
}

// AbortTx marks the saga Compensating in the caller's transaction tx: forward
// steps are refused from then on (a *StateError). Call it in the transaction
// that handles the permanent failure of a step (the consumer of a
// PaymentFailed event), then, after tx committed, Compensate. If the process
// dies in between, List finds the saga Compensating.
//
// Aborting a saga that is already compensating, compensated or failed is a
// no-op; a completed saga gives a *StateError.
func (c *Coordinator[TTx]) AbortTx(ctx context.Context, tx TTx, sagaID string) error {
	if txnil.Is(tx) {
		return nilTxError(sagaID, "abort")
	}
	return c.setState(ctx, c.drv.SagasTx(tx), sagaID, "abort", []State{Running}, Compensating,
		Compensating, Compensated, Failed)
}

// setState moves the saga from one of from to to; a saga already in one of
// done is left as it is without error.
func (c *Coordinator[TTx]) setState(ctx context.Context, ex driver.SagaExecutor, sagaID, op string, from []State, to State, done ...State) error {
	if err := checkName("saga ID", sagaID); err != nil {
		return fmt.Errorf("saga: %s: %w", op, err)
	}
	changed, cur, err := ex.SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: sagaID, From: states(from), To: string(to), Now: c.cfg.Now()})
	if err != nil {
		return wrapErr(sagaID, op, err)
	}
	if changed || slices.Contains(done, State(cur)) {
		return nil
	}
	return &StateError{SagaID: sagaID, Op: op, State: State(cur), Want: from}
}

func states(ss []State) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

// errNilTx is the error of a ...Tx method given a nil transaction.
var errNilTx = errors.New("nil transaction (a method ending in Tx joins the caller's transaction: pass the one it must write in)")

// nilTxError refuses a nil transaction: on PostgreSQL the driver would
// panic on it.
func nilTxError(sagaID, op string) error {
	return fmt.Errorf("saga %q: %s: %w", sagaID, op, errNilTx)
}

// wrapErr turns driver errors into this package's.
func wrapErr(sagaID, op string, err error) error {
	var se *driver.SagaStateError
	switch {
	case errors.As(err, &se):
		want := make([]State, len(se.Want))
		for i, s := range se.Want {
			want[i] = State(s)
		}
		return &StateError{SagaID: sagaID, Op: op, State: State(se.State), Want: want}
	case errors.Is(err, driver.ErrNotFound):
		return fmt.Errorf("saga %q: %s: %w", sagaID, op, ErrNotFound)
	}
	return fmt.Errorf("saga %q: %s: %w", sagaID, op, err)
}

// endTimeout bounds the statements that must run even when the caller's
// context has ended (a rollback, marking a saga Failed): they ignore its
// cancellation, not a database that stopped answering.
const endTimeout = 5 * time.Second

// rollback ends tx, even when ctx is already cancelled.
func (c *Coordinator[TTx]) rollback(ctx context.Context, tx TTx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if err := c.drv.Rollback(ctx, tx); err != nil {
		c.cfg.Logger.Warn("saga: rollback failed", "err", err)
	}
}
