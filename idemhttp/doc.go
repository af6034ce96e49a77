// Package idemhttp makes HTTP commands idempotent with the Idempotency-Key
// header (rule R-DIST-IDEM-3, docs/rules.md).
//
// A Middleware wraps handlers as ordinary net/http middleware
// (func(http.Handler) http.Handler via Middleware.Handler), so it works with
// http.ServeMux, chi and anything net/http-compatible:
//
//	drv, _ := pgdriver.New(pool, nil)
//	_ = drv.Migrate(ctx)
//	mw, _ := idemhttp.New(drv, nil) // ModeTx, 24h TTL
//	mux.Handle("POST /v1/payments", mw.Handler(createPayment))
//
// # What a client sees
//
//	request                                        answer
//	new key                                        the handler runs; its response is stored and sent
//	same key, same request, completed              stored status, headers, body, trailers byte for byte + Idempotent-Replayed: true
//	same key and route, other target/body          409 key-reused (422 with Config.MismatchStatus)
//	same key while the first is still running     waits up to Config.Wait for its outcome, else 409 request-in-progress + Retry-After
//	no key / malformed / two keys                  400 key-missing / key-malformed / key-multiple
//	body larger than Config.MaxBodyBytes           413 body-too-large, whatever its size; the key is not claimed
//	body not received within the read deadline     408 body-timeout (http.Server.ReadTimeout): send it again, same key
//	body unreadable (connection broken mid-body)   400 validation; the read error is logged, not sent
//	Scope hook error, or an empty principal        401 unauthenticated; 413 / 408 / 400 as above when the hook read such a body
//	Scope hook error once the request's ctx ended  503 store-unavailable + Retry-After, as for a deadline or cancellation below
//	Scope hook error wrapping ErrScopeUnavailable,  503 store-unavailable + Retry-After; the error is logged, not sent
//	or a database's (connection, timeout)
//	store unreachable                              503 store-unavailable + Retry-After; the handler does not run
//	idem's tables missing (Migrate not run)        500 store-unavailable, no Retry-After; the handler does not run
//	role refused a privilege or a login            500 store-unavailable, no Retry-After (PostgreSQL 42501, class 28): nothing was committed
//	request deadline passed before the claim       503 store-unavailable + Retry-After; the handler does not run
//	request cancelled (client gone, BaseContext)   503 store-unavailable + Retry-After, not net/http's empty 200; not executed
//	record write or COMMIT refused by the server   503 store-unavailable + Retry-After (500, none, for 42501 / class 28): nothing was committed
//	commit's connection lost or unanswered         503 outcome-unknown: retry with the same key
//	session ended while the handler paused         503 store-unavailable (idle_in_transaction_session_timeout): nothing was committed
//	handler's statement failed (PostgreSQL)        500 transaction-aborted: nothing was committed
//
// Every error is RFC 9457 application/problem+json with Cache-Control:
// no-store; the type URIs are documented in docs/problems.md.
//
// The store's work after the handler returned (the COMMIT; in ModeLease
// each attempt to store the outcome) goes on when the client has gone, and
// is bounded by Config.CommitTimeout (30s by default): a COMMIT that
// PostgreSQL does not answer (a partition that closes nothing, a hung
// server) answers 503 outcome-unknown then, instead of holding the
// request, its connection and the key until the operating system gives up
// on the socket.
//
// The stored headers are those of an allow-list (Config.ReplayHeaders).
// The handler's headers replace those an outer middleware set under the
// same names, on the first answer and on a replay, except Vary, whose
// values are added to the outer middleware's (a CORS middleware's Vary:
// Origin stays).
// Trailers whose names it lists are stored and replayed too, as trailers,
// whichever way the handler set them: declared in a Trailer header before
// WriteHeader, or with http.TrailerPrefix in the header map. The Trailer
// header itself is only replayed when listed (a client reads undeclared
// trailers after the body all the same).
//
// Put response compression outside the middleware (wrapping it): the
// stored response is then the uncompressed one, and each replay is
// compressed for the client that asks. Accept-Encoding is not part of the
// fingerprint, so a compressor inside the middleware stores the encoding
// the first attempt negotiated (Content-Encoding is replayed), and a retry
// that does not accept it gets it all the same.
//
// # Browser clients
//
// A browser calling the API from another origin (a single-page app on
// https://shop.example posting to https://api.example with fetch()) sends a
// preflight OPTIONS before each POST, as Idempotency-Key is not a
// CORS-safelisted header, and lets the app read an answer only when it
// carries the app's origin in Access-Control-Allow-Origin. Put the CORS
// middleware outside this one (wrapping it), and outside a ServeMux whose
// patterns name their method ("POST /v1/payments" answers a preflight 405
// itself):
//
//	api := corsMiddleware(mux) // mux.Handle("POST /v1/payments", mw.Handler(h))
//
// The preflight never reaches this middleware (nor would it be claimed:
// OPTIONS is not protected unless Config.Methods lists it), and every answer, this
// middleware's own included (400 key-missing, 409, 413, 503 with
// Retry-After), carries the headers the CORS middleware set for the
// request's own Origin: a retry from another origin is answered for that
// origin, with the stored status and body. Configure the CORS middleware
// with Idempotency-Key (and Content-Type, for JSON) among its allowed
// request headers, and Idempotent-Replayed and Retry-After (Location too
// if the app reads it) among its exposed response headers: the app reads
// no other header than the CORS-safelisted ones (Content-Type,
// Cache-Control, Content-Language, ...). The problem+json body of an
// error is readable as is. A CORS middleware inside this one fails
// instead: this middleware's own answers and every replay carry no
// Access-Control-Allow-Origin (the CORS headers are not stored, and
// Config.ReplayHeaders refuses them), and the browser hands the app a
// network error for each, which an app retrying on network errors
// retries with the same key again and again, never reading its result.
// A browser authenticates with cookies more often than with an
// Authorization header: set Config.Scope to the session's principal (the
// default puts every request without Authorization in one scope).
//
// The handler's response is buffered: nothing of it reaches the client
// before its outcome is stored (in ModeTx, committed) or the key let go.
// The ResponseWriter the handler gets is no http.Flusher, and the methods of
// http.NewResponseController (Flush, Hijack, SetReadDeadline,
// SetWriteDeadline, EnableFullDuplex) return http.ErrNotSupported on it. A
// streaming response (server-sent events) does not belong behind the
// middleware.
//
// # Keys, scopes and fingerprints
//
// A key is looked up within a scope: the principal returned by
// Config.Scope (by default a hash of the Authorization header), the method
// and the route (Config.Route, by default the ServeMux pattern). One client
// can never receive another client's stored response. Scope may read the
// request body (an HMAC signature check): its first read has the middleware
// read the whole body and hands the hook a copy, so the fingerprint and the
// handler see the whole body whatever the hook does with r.Body; a hook
// that does not read it rejects a request before its body is read. The
// fingerprint is a SHA-256 of the method, the request target (path and
// query) and the body; JSON bodies are canonicalised first (CanonicalJSON),
// so key order and whitespace do not cause false conflicts.
//
// # Modes
//
// ModeTx (the default) runs the handler in a transaction that holds the
// key, with that transaction in its context (TxFromContext), and stores the
// response in the same transaction before COMMIT. With a driver that
// implements driver.TxClaimer (pgdriver, sqlitedriver; pgsqldriver too,
// without pipelining) this costs one record write, and on pgdriver and
// sqlitedriver the round trips of the handler alone. On pgdriver the first
// round trip locks (scope, key), unless it holds a completed record, and
// reads the record: a completed one is replayed there, with no transaction;
// otherwise BEGIN travels with the handler's first statement, and the
// completed record with COMMIT and the lock's release. A duplicate waits for the lock (bounded by
// Config.Wait) and replays what the first committed; the unique index on
// (scope, key) stays the safety net (a record stored meanwhile by a writer
// that took no lock rolls the transaction back and the request looks
// again). Other drivers take the generic path: an in-progress record
// inserted on the unique index, on which a duplicate blocks, completed with
// an UPDATE before COMMIT. Either way exactly one request executes, across
// goroutines, processes and replicas, and a crash at any point leaves
// either the effect and its record or neither. The handler must do its
// writes through the transaction and must not commit it (see
// TxFromContext).
//
// ModeLease is for effects outside the database (a payment provider call):
// the claim is an in-progress record with a lease the middleware renews
// while the handler runs; a crashed owner's lease expires and the next retry
// takes over. A claim that waited for the record's row renews its lease
// before the handler runs, and a failure to store the outcome is retried a
// few times, so a live owner is never taken over. If the owner dies after
// the external effect and before the response is stored, that retry
// executes again: pass the key downstream to close the window.
//
// # Outcomes
//
// Config.Store decides what is stored: by default every status below 500
// except 408, 425 and 429. Other outcomes, a panic and (ModeTx) a request
// cancelled by the client roll the transaction back or release the key, so
// a retry executes again (a cancelled request is answered 503
// store-unavailable with Retry-After: a context also ends with the client
// still there, when the server's BaseContext ends at shutdown); so does a panic of a hook that runs while the key
// is held (Config.Store, Config.Now, the spans of Config.Tracer), before or
// after the handler, and the panic goes on. In ModeTx a handler that ended the transaction
// itself gets 500 transaction-ended whatever it answered (with a driver
// that implements driver.EndedRollbacker, as the three of idem do): its
// failure passed on would be retried, and the retry would execute again
// what its COMMIT committed (see TxFromContext). A response to store that is larger than
// Config.MaxResponseBytes is never silently left unstored: ModeTx rolls back
// and answers 500; ModeLease stores that 500, since the effect cannot be
// undone. A larger failure (not stored anyway) is passed on with its status
// and a response-too-large body with the member "stored": false, which
// tells a client (idemclient) that it may retry with the same key.
//
// # Replay cache
//
// A completed record never changes until it expires, so a Middleware keeps
// the completed records it commits or reads in memory, bounded by
// Config.ReplayCacheBytes (32 MiB by default, least recently used out
// first), and answers a retry of one of them without the store: the same
// replay, or the same mismatch answer, with no database round trip, on
// every instance and with no invalidation between instances. An entry is
// never served at or after its record's expiry (by Config.Now; an entry
// cached at commit expires at that expiry truncated to the second, as a
// store keeps times to the microsecond or coarser); a miss goes to the
// store as it would without the cache. Middleware.CacheStats counts
// hits and misses; a hit is reported as OutcomeReplayed or OutcomeMismatch,
// like the same answer from the store. NoReplayCache disables the cache.
//
// The one thing it changes: an operator who deletes a record by hand, to
// let its key execute again, must also restart the instances or wait for
// the record's expiry, since an instance holding the record keeps replaying
// it.
//
// # Retention
//
// Records deduplicate for Config.TTL (24h by default); a TTL outside 24h..72h
// is rejected unless Config.TTLOverrideReason explains it (R-DIST-IDEM-5).
// Expired records are treated as absent and replaced.
package idemhttp
