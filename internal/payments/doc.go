// Package payments is the domain of idemd, the reference daemon: creating a
// payment exactly once and reading it back.
//
// A payment is protected twice (R-DIST-IDEM-4). The HTTP handler runs behind
// the idemhttp middleware in ModeTx, so a retry with the same Idempotency-Key
// replays the stored response; and the payment table has the UNIQUE
// constraint ProviderExternalIDKey on (payment_provider,
// external_payment_id), so the same payment sent under another key returns
// the existing payment (200) instead of creating a second one (201). A
// request under another key whose provider and external payment id are
// taken by a payment with another amount or customer is not the same
// payment: 409 (problem type conflict), nothing created. A provider is
// written in lower case ("sber"; "Sber" is refused, 422), so that two
// systems sending one payment cannot spell its provider two ways and
// create it twice; for the same reason the provider and the external
// payment id must be in Unicode normalization form C and hold no
// invisible format character (U+200B, U+FEFF, ...) nor lone UTF-16
// surrogate escape ("\ud800", which JSON decoders read as U+FFFD, so that
// "e\ud800" and "e\udbff" would be one identity): 422 otherwise.
// Providers starting with ReservedProviderPrefix are
// idemd's own (the order saga's charges) and refused (422).
//
// The handler is generic over the transaction type of the database library
// (pgx.Tx, *sql.Tx) and does its writes in the middleware's transaction
// through a Store. Stores live in sub-packages, one per database, each with
// its own embedded migrations (separate from idem's): pgstore (PostgreSQL,
// numeric(19,4) amounts) and sqlitestore (SQLite, amounts as exact decimal
// TEXT). Both pass the suite in storetest.
//
// # JSON
//
// POST /v1/payments takes
//
//	{"provider":"sber","external_payment_id":"ext-1","amount":"100.50","customer_id":42}
//
// and answers
//
//	{"id":"1","provider":"sber","external_payment_id":"ext-1","amount":"100.5000",
//	 "status":"PENDING","customer_id":42,"created_at":"2025-01-02T03:04:05.123456Z"}
//
// id is a JSON string: it is an opaque identifier of up to 19 digits
// (bigint), and JavaScript clients read JSON numbers above 2^53 as rounded
// floats. amount is a decimal string with exactly 4 fractional digits, never
// a JSON number, for the same reason. created_at is RFC 3339 in UTC with
// microseconds.
package payments
