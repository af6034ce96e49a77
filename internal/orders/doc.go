// Package orders is idemd's orders domain: POST /v1/orders stores an order
// and enqueues its OrderCreated.v1 event in the outbox in ONE transaction
// (the idempotency middleware's, in idemhttp's ModeTx), and a projection
// applies the order events, consumed from Kafka through an inbox, to a
// per-customer summary read by GET /v1/customers/{id}/summary.
//
// The summary is commutative: each event only adds to counters
// (OrderCreated.v1 orders+1, OrderConfirmed.v1 confirmed+1 and its amount
// to total_amount, OrderRejected.v1 rejected+1; every one raises
// last_order_id to its order ID), so an order's events give the same
// summary in any order (an outcome applied before its creation makes a
// row with zero orders). pending is orders-confirmed-rejected, never below
// 0. ProjectionBatch adds up a partition batch into one SummaryDelta per
// customer and applies them in ascending customer ID order, so replicas'
// transactions lock the summary rows in one order and never deadlock.
//
// The data flow is: HTTP -> order row + outbox row (one transaction) ->
// outbox relay -> Kafka -> inbox consumer -> customer_order_summary row (in
// the inbox's transaction). Every arrow is at-least-once; the idempotency
// key, the outbox's event ID and the inbox make the whole effectively
// exactly-once.
//
// PaymentSaga is the order payment saga (package saga), driven by the
// same events through a second inbox consumer: on OrderCreated.v1 it
// starts the saga "order-<id>" and charges the order once (a payment of
// provider SagaProvider through the payments store, in the inbox's
// transaction, status CAPTURED, and PaymentCaptured.v1 emitted with an ID
// derived from the step); on PaymentCaptured.v1 it sets the order
// CONFIRMED, emits OrderConfirmed.v1 (ID saga.EventID(saga ID,
// "confirm-order", "")) and completes the saga. An amount over
// PaymentLimit is declined for good: the saga is aborted in the same
// transaction, and RunCompensator compensates it after the commit, setting
// the order REJECTED and emitting OrderRejected.v1 (ID saga.EventID(saga
// ID, "compensate:place-order", "")), the compensation of the first step,
// place-order. Orders go CREATED -> CONFIRMED or REJECTED; the saga
// ignores the two outcome events, which are for the projection.
//
// The store is per database, like payments': pgstore (PostgreSQL,
// numeric(19,4)) and sqlitestore (SQLite, exact decimal TEXT), both
// checked by storetest.
package orders
