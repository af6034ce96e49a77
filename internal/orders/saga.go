package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/flaplog"
	"github.com/idemkit/idem/internal/payments"
	"github.com/idemkit/idem/saga"
)

// The order payment saga: its type, its steps and the event it emits.
const (
	// SagaType is the type of every order payment saga.
	SagaType = "order-payment"
	// StepPlace is the first forward step: it has no effect (the order
	// exists already) and records the order ID; its compensation rejects
	// the order.
	StepPlace = "place-order"
	// StepCharge creates the order's payment and emits
	// EventPaymentCaptured.
	StepCharge = "charge-payment"
	// StepConfirm confirms the order and completes the saga.
	StepConfirm = "confirm-order"
	// EventPaymentCaptured is the type of the event StepCharge emits.
	EventPaymentCaptured = "PaymentCaptured.v1"
	// SagaProvider is the payment provider of the saga's payments; their
	// external payment ID is the saga ID.
	SagaProvider = "idemd-saga"
)

// PaymentLimit is the demonstration limit of the saga's payment step: an
// order whose amount exceeds it is declined for good and REJECTED.
var PaymentLimit = decimal.RequireFromString("10000.0000")

// SagaID returns the ID of the payment saga of order id, "order-<id>",
// which is also the external payment ID of its payment.
func SagaID(orderID int64) string { return "order-" + strconv.FormatInt(orderID, 10) }

// PaymentCaptured is the payload of a PaymentCaptured.v1 event.
type PaymentCaptured struct {
	OrderID    int64  `json:"order_id"`
	PaymentID  int64  `json:"payment_id"`
	CustomerID int64  `json:"customer_id"`
	Amount     string `json:"amount"` // decimal string, AmountScale digits
}

// PaymentSaga drives the order payment saga from the events it consumes;
// it keeps nothing in memory (the state is in the saga tables):
//
//	OrderCreated.v1    -> StartTx, step place-order, then step charge-payment
//	                      (payment + PaymentCaptured.v1 in the outbox), or,
//	                      above PaymentLimit, AbortTx (the charge failed for good)
//	PaymentCaptured.v1 -> step confirm-order (CONFIRMED + OrderConfirmed.v1
//	                      in the outbox), CompleteTx
//	after an AbortTx   -> Compensate (RunCompensator): compensate:place-order
//	                      sets REJECTED (+ OrderRejected.v1 in the outbox)
//	OrderConfirmed.v1, OrderRejected.v1 -> ignored (for the projection)
//
// OrderConfirmed.v1 has the ID saga.EventID("order-<id>", "confirm-order",
// "") and OrderRejected.v1 saga.EventID("order-<id>",
// "compensate:place-order", ""), so a step that runs again re-emits the
// same event, which the outbox drops.
//
// Every step runs once per saga (saga.Step), every event once per
// consumer (the inbox), and the payment exists once per order (UNIQUE
// provider and external ID).
type PaymentSaga[TTx any] struct {
	sagas    *saga.Coordinator[TTx]
	orders   Store[TTx]
	payments payments.Store[TTx]
	log      *slog.Logger
	now      func() time.Time
	// recoverTimeout bounds a Recover of RunCompensator (RecoverTimeout).
	recoverTimeout time.Duration
	// recoverLog limits the lines of RunCompensator's failed passes.
	recoverLog flaplog.Limiter

	mu sync.Mutex
	// failedAfter is where Recover's next page of Failed sagas starts (nil:
	// the first): the Failed sagas left to an operator are never updated,
	// so a list from the start would return only them once there are a
	// page of them.
	failedAfter *saga.Saga
	// failedAt is when Recover last went through a page of Failed sagas
	// (zero: never).
	failedAt time.Time
}

// NewPaymentSaga returns the saga on the coordinator and the stores of one
// database. log may be nil.
func NewPaymentSaga[TTx any](sagas *saga.Coordinator[TTx], ord Store[TTx], pay payments.Store[TTx], log *slog.Logger) *PaymentSaga[TTx] {
	if log == nil {
		log = slog.Default()
	}
	return &PaymentSaga[TTx]{sagas: sagas, orders: ord, payments: pay, log: log, now: time.Now, recoverTimeout: RecoverTimeout}
}

// Handle is the saga consumer's handler (idemkafka.ConsumerConfig.Handler):
// it runs in the inbox's transaction tx and ignores (applies as no-ops)
// the event types it does not know. Unreadable payloads are poison, and so
// is another version of a type it acts on (an OrderCreated.v2 from a newer
// producer): dead-lettered, never skipped (see otherVersion).
func (p *PaymentSaga[TTx]) Handle(ctx context.Context, tx TTx, e event.Envelope) error {
	switch e.Type {
	case EventOrderCreated:
		return p.onCreated(ctx, tx, e)
	case EventPaymentCaptured:
		return p.onCaptured(ctx, tx, e)
	case EventOrderConfirmed, EventOrderRejected:
		return nil // the saga's own outcome, for the projection
	}
	return otherVersion(e, EventOrderCreated, EventPaymentCaptured)
}

func (p *PaymentSaga[TTx]) onCreated(ctx context.Context, tx TTx, e event.Envelope) error {
	oc, amount, err := decodeCreated(e)
	if err != nil {
		return err
	}
	id := SagaID(oc.OrderID)
	// The order decides, not the saga row: a finished saga is deleted by
	// the retention sweep, and a copy of the event delivered after that
	// (a consumer group reset on a topic that keeps events longer than the
	// inboxes remember them) would start a new saga and charge an order
	// that was rejected, or confirm one a second time. Only a CREATED
	// order has a saga to run; its saga is deleted only once it finished,
	// when the order is no longer CREATED.
	o, err := p.orders.GetTx(ctx, tx, oc.OrderID)
	switch {
	case errors.Is(err, ErrNotFound):
		p.log.WarnContext(ctx, "order saga: OrderCreated.v1 of an unknown order, ignored", "saga", id, "event", e.ID)
		return nil
	case err != nil:
		return err
	case o.CustomerID != oc.CustomerID || !o.Amount.Equal(amount):
		// Another order under this ID: a database restored from a backup
		// (or failed over to a replica that lagged) lost the event's order
		// and handed its ID out again. Charging it would charge the new
		// order the lost one's amount, to the lost one's customer.
		p.log.WarnContext(ctx, "order saga: OrderCreated.v1 of another order with this ID (a database restored from a backup?), ignored",
			"saga", id, "event", e.ID, "event_customer_id", oc.CustomerID, "event_amount", oc.Amount,
			"customer_id", o.CustomerID, "amount", o.Amount.StringFixed(AmountScale))
		return nil
	case o.Status != StatusCreated:
		p.log.InfoContext(ctx, "order saga: OrderCreated.v1 of an order already "+o.Status+", ignored", "saga", id, "event", e.ID)
		return nil
	}
	s, _, err := p.sagas.StartTx(ctx, tx, id, SagaType, e.Payload)
	if err != nil {
		return err
	}
	if s.State != saga.Running {
		return nil // it moved on: a late copy of the event
	}
	if _, _, err := p.sagas.StepTx(ctx, tx, id, StepPlace, func(context.Context, TTx) ([]byte, error) {
		return []byte(strconv.FormatInt(oc.OrderID, 10)), nil
	}); err != nil {
		return err
	}
	if amount.GreaterThan(PaymentLimit) {
		// The charge fails for good: the step is not recorded (there is
		// nothing to undo), the saga stops here, in this transaction;
		// RunCompensator compensates it after the commit.
		p.log.InfoContext(ctx, "order saga: payment declined, aborting", "saga", id, "amount", oc.Amount, "limit", PaymentLimit.StringFixed(AmountScale))
		return p.sagas.AbortTx(ctx, tx, id)
	}
	_, _, err = p.sagas.StepTx(ctx, tx, id, StepCharge, func(ctx context.Context, tx TTx) ([]byte, error) {
		charge := payments.NewPayment{
			Provider:   SagaProvider,
			ExternalID: id,
			Amount:     amount,
			CustomerID: oc.CustomerID,
			Status:     payments.StatusCaptured,
		}
		pay, created, err := p.payments.CreateOrGet(ctx, tx, charge)
		if err != nil {
			return nil, err
		}
		if !created && (!pay.Same(charge) || pay.Status != payments.StatusCaptured) {
			// Not this order's charge (the public API refuses the saga's
			// provider, so only a hand-made row gets here): never confirm
			// an order on it. The event is dead-lettered and the order
			// stays CREATED, for the watchdog to reject.
			return nil, fmt.Errorf("%w: order %d: payment %d (%s, %s) exists with other details (amount %s, customer %d, %s): not this order's charge",
				event.ErrPoison, oc.OrderID, pay.ID, pay.Provider, pay.ExternalID, pay.Amount.StringFixed(AmountScale), pay.CustomerID, pay.Status)
		}
		if err := p.orders.SetPayment(ctx, tx, oc.OrderID, pay.ID); err != nil {
			return nil, err
		}
		ev, err := event.New(EventPaymentCaptured, strconv.FormatInt(oc.OrderID, 10), PaymentCaptured{
			OrderID:    oc.OrderID,
			PaymentID:  pay.ID,
			CustomerID: oc.CustomerID,
			Amount:     amount.StringFixed(AmountScale),
		})
		if err != nil {
			return nil, err
		}
		if _, err := p.sagas.EmitTx(ctx, tx, id, StepCharge, "", ev); err != nil {
			return nil, err
		}
		return []byte(strconv.FormatInt(pay.ID, 10)), nil
	})
	return err
}

func (p *PaymentSaga[TTx]) onCaptured(ctx context.Context, tx TTx, e event.Envelope) error {
	var pc PaymentCaptured
	if err := json.Unmarshal(e.Payload, &pc); err != nil || pc.OrderID <= 0 {
		return fmt.Errorf("%w: %s %s: bad payload %s", event.ErrPoison, e.Type, e.ID, e.Payload)
	}
	id := SagaID(pc.OrderID)
	s, err := p.sagas.GetTx(ctx, tx, id)
	if errors.Is(err, saga.ErrNotFound) {
		p.log.WarnContext(ctx, "order saga: payment of an unknown saga, ignored", "saga", id, "event", e.ID)
		return nil
	}
	if err != nil {
		return err
	}
	if s.State != saga.Running {
		return nil // completed (a late copy) or compensating
	}
	if _, _, err := p.sagas.StepTx(ctx, tx, id, StepConfirm, func(ctx context.Context, tx TTx) ([]byte, error) {
		return nil, p.setStatus(ctx, tx, id, StepConfirm, pc.OrderID, StatusConfirmed, EventOrderConfirmed)
	}); err != nil {
		return err
	}
	return p.sagas.CompleteTx(ctx, tx, id)
}

// Compensations are the saga's compensations. Only place-order is ever
// compensated: a saga is aborted only before its charge, and never after
// its confirmation. A charge that captured money cannot be undone (idemd
// has no refunds): its compensation fails (wrapping saga.ErrNoCompensation)
// on every attempt, and Compensate leaves the saga Failed, for an operator.
func (p *PaymentSaga[TTx]) Compensations() saga.Compensations[TTx] {
	return saga.Compensations[TTx]{
		StepPlace: func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
			orderID, err := strconv.ParseInt(string(fwd.Result), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("order saga: result %q of %s: %w", fwd.Result, StepPlace, err)
			}
			return nil, p.setStatus(ctx, tx, SagaID(orderID), saga.CompensationName(StepPlace), orderID, StatusRejected, EventOrderRejected)
		},
		// A charge recorded as declined (by the watchdog) charged
		// nothing: there is nothing to undo. A real charge cannot be
		// undone (no refunds): the saga fails, for an operator.
		StepCharge: func(_ context.Context, _ TTx, fwd saga.StepRecord) ([]byte, error) {
			if declined(fwd.Result) {
				return nil, nil
			}
			return nil, fmt.Errorf("order saga: payment %s was captured and idemd has no refunds: %w", fwd.Result, saga.ErrNoCompensation)
		},
	}
}

// declined reports whether a charge-payment result says nothing was
// charged.
func declined(result []byte) bool { return strings.HasPrefix(string(result), DeclinedPrefix) }

// setStatus sets the status of order orderID through tx and emits its
// event typ (OrderConfirmed.v1, OrderRejected.v1) in the outbox, in the
// same transaction, with the ID saga.EventID(sagaID, step, ""): a step
// (or compensation) that runs again emits the same ID, which the outbox
// and the inboxes drop. The payload is read from the order row, through
// tx.
func (p *PaymentSaga[TTx]) setStatus(ctx context.Context, tx TTx, sagaID, step string, orderID int64, status, typ string) error {
	if err := p.orders.SetStatus(ctx, tx, orderID, status); err != nil {
		return err
	}
	o, err := p.orders.GetTx(ctx, tx, orderID)
	if err != nil {
		return fmt.Errorf("order saga: %s: %w", step, err)
	}
	ev, err := OutcomeEvent(typ, o)
	if err != nil {
		return err
	}
	_, err = p.sagas.EmitTx(ctx, tx, sagaID, step, "", ev)
	return err
}

// Recover compensates the order sagas that are Compensating (at most
// limit): those aborted by Handle or the watchdog, and those whose
// compensation a crash or a database failure interrupted; and, at most
// once per FailedRetryInterval, a page of at most limit Failed sagas,
// whose compensation kept failing. It returns how many it finished; the
// errors of the others are logged. A Failed saga with a completed step
// that has no compensation (a charge) is left alone, for an operator:
// compensating it again would fail the same way (it was logged when it
// failed).
func (p *PaymentSaga[TTx]) Recover(ctx context.Context, limit int) (int, error) {
	// Compensating first, in a list of their own: Failed sagas left alone
	// are never updated, so they would stay the least recently updated
	// and could fill a common list.
	list, err := p.sagas.List(ctx, limit, saga.Compensating)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	now := p.now()
	after, due := p.failedAfter, p.failedAt.IsZero() || now.Sub(p.failedAt) >= FailedRetryInterval
	p.mu.Unlock()
	var failed []*saga.Saga
	if due {
		failed, err = p.sagas.ListAfter(ctx, limit, after, saga.Failed)
		if err != nil {
			return 0, err
		}
		var next *saga.Saga // a short page is the last: start again
		if len(failed) == limit {
			next = failed[len(failed)-1]
		}
		p.mu.Lock()
		p.failedAfter, p.failedAt = next, now
		p.mu.Unlock()
	}
	comps := p.Compensations()
	done := 0
	for _, s := range append(list, failed...) {
		if s.Type != SagaType {
			continue
		}
		if s.State == saga.Failed {
			full, err := p.sagas.Get(ctx, s.ID)
			if err != nil {
				if ctx.Err() != nil {
					return done, ctx.Err()
				}
				p.log.WarnContext(ctx, "order saga: read failed saga", "saga", s.ID, "err", err)
				continue
			}
			if step := uncompensable(full, comps); step != "" {
				p.log.DebugContext(ctx, "order saga: failed for good, left to an operator", "saga", s.ID, "step", step)
				continue
			}
		}
		if err := p.sagas.Compensate(ctx, s.ID, comps); err != nil {
			if ctx.Err() != nil {
				return done, ctx.Err()
			}
			p.log.WarnContext(ctx, "order saga: compensation failed", "saga", s.ID, "state", s.State, "err", err)
			continue
		}
		done++
		p.log.InfoContext(ctx, "order saga: compensated", "saga", s.ID)
	}
	return done, nil
}

// uncompensable returns a completed forward step of s that is not
// compensated and has no compensation in comps, or "".
func uncompensable[TTx any](s *saga.Saga, comps saga.Compensations[TTx]) string {
	for _, st := range s.Steps {
		if st.Compensation || s.Compensated(st.Name) {
			continue
		}
		if _, ok := comps[st.Name]; !ok || (st.Name == StepCharge && !declined(st.Result)) {
			return st.Name
		}
	}
	return ""
}

// FailedRetryInterval is how often Recover goes through the Failed sagas
// (a page of them): a Failed saga's compensation failed CompensationAttempts
// times in a row, and trying it again after every consumer batch would
// repeat those attempts, and their warnings, back to back.
const FailedRetryInterval = time.Minute

// RecoverBatch is how many sagas one Recover of RunCompensator handles.
const RecoverBatch = 100

// RecoverTimeout bounds one Recover of RunCompensator: one whose statement
// went on a connection the network black-holes (a partition that closes
// nothing: a failover behind a load balancer or NAT) fails then, logged,
// instead of waiting as long as TCP does (about 15 min) with no saga
// compensated and nothing logged; the next goes on another connection. A
// compensation it cuts short is tried again (its saga stays compensating).
const RecoverTimeout = time.Minute

// RunCompensator runs Recover at once, after each signal on wake (sent
// after a saga consumer's batch committed) and every interval, each within
// RecoverTimeout, until ctx ends. It returns nil when ctx ends.
func (p *PaymentSaga[TTx]) RunCompensator(ctx context.Context, wake <-chan struct{}, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, p.recoverTimeout)
		_, err := p.Recover(rctx, RecoverBatch)
		if err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("not done within %s (the database does not answer?): %w", p.recoverTimeout, err)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
		case err != nil:
			switch a, ep := p.recoverLog.Failed(p.now()); a {
			case flaplog.Start:
				p.log.WarnContext(ctx, "order saga: recovery failed", "err", err)
			case flaplog.Summary:
				p.log.WarnContext(ctx, "order saga: recovery still failing; repeats are logged at most every "+flaplog.Interval.String(),
					"err", err, "suppressed", ep.Suppressed, "failed_passes", ep.Failures, "passed", ep.Successes, "since", ep.First)
			}
		default:
			if a, ep := p.recoverLog.Succeeded(p.now()); a == flaplog.End {
				p.log.InfoContext(ctx, "order saga: recovery succeeds again; no pass failed for "+flaplog.Quiet.String(),
					"failed_passes", ep.Failures, "passed", ep.Successes, "since", ep.First, "last_failure", ep.Last)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-t.C:
		}
	}
}
