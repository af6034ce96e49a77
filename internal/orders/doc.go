// Package orders is idemd's orders domain: POST /v1/orders stores an order
// and enqueues its OrderCreated.v1 event in the outbox in ONE transaction
// (the idempotency middleware's, in idemhttp's ModeTx), and a projection
// applies those events, consumed from Kafka through an inbox, to a
// per-customer summary read by GET /v1/customers/{id}/summary.
//
// The data flow is: HTTP -> order row + outbox row (one transaction) ->
// outbox relay -> Kafka -> inbox consumer -> customer_order_summary row (in
// the inbox's transaction). Every arrow is at-least-once; the idempotency
// key, the outbox's event ID and the inbox make the whole effectively
// exactly-once.
//
// The store is per database, like payments': pgstore (PostgreSQL,
// numeric(19,4)) and sqlitestore (SQLite, exact decimal TEXT), both
// checked by storetest.
package orders
