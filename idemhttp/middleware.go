package idemhttp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/dbclock"
	"github.com/idemkit/idem/internal/dberr"
	"github.com/idemkit/idem/internal/txnil"
	"github.com/idemkit/idem/problem"
)

// ReplayedHeader marks a replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// Middleware makes the protected methods of the handlers it wraps
// idempotent. Build one per policy with New; it is safe for concurrent use.
type Middleware[TTx any] struct {
	drv           driver.RecordDriver[TTx]
	cfg           Config
	replayHeaders []string
	cache         *replayCache // nil when disabled (cache.go)
	waits         waitGates    // one duplicate per key waits in the store (waitgate.go)
	// emptyRouteWarned: Config.Route returned "" once, and it was logged.
	emptyRouteWarned atomic.Bool
	// clock is the default clock (Config.Now not set): the host's,
	// corrected by the database's (nil otherwise).
	clock *dbclock.Clock
}

// New returns a middleware storing its records through drv. cfg may be nil
// for the defaults; an invalid cfg is an error.
func New[TTx any](drv driver.RecordDriver[TTx], cfg *Config) (*Middleware[TTx], error) {
	if txnil.Is(drv) { // nil, or a nil *Driver from an Open whose error was ignored
		return nil, errors.New("idemhttp: nil driver")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	defaultScope := c.Scope == nil
	defaultNow := c.Now == nil
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	var clock *dbclock.Clock
	if defaultNow {
		// Leases and expiry times are written by one replica and read
		// by another: the database's clock is the one they share.
		clock = dbclock.New(drv, c.Logger, "idemhttp")
		c.Now = clock.Now
	}
	if defaultScope {
		c.Logger.Warn("idemhttp: Config.Scope not set: keys are scoped by a hash of the Authorization header; " +
			"a retry sent with a refreshed token executes again, and requests without the header share one key space: " +
			"set Scope to the authenticated principal's ID")
	}
	if c.TTLOverrideReason != "" && (c.TTL < MinTTL || c.TTL > MaxTTL) {
		c.Logger.Warn("idemhttp: TTL outside 24h..72h", "ttl", c.TTL, "reason", c.TTLOverrideReason)
	}
	return &Middleware[TTx]{drv: drv, cfg: c, replayHeaders: c.replayHeaders(),
		cache: newReplayCache(c.ReplayCacheBytes), clock: clock}, nil
}

// Handler wraps next. Its signature is that of net/http middleware, so it
// works with http.ServeMux, chi and anything net/http-compatible.
func (m *Middleware[TTx]) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(m.cfg.Methods, r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		if m.cfg.Tracer != nil {
			m.serveTraced(w, r, next)
			return
		}
		m.serve(w, r, next)
	})
}

// serve handles a protected request.
func (m *Middleware[TTx]) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	// The default clock follows the database's (one query every
	// dbclock.Every at most, before the request's times are taken): the
	// lease and expiry written are read by replicas on other hosts.
	m.clock.Sync(r.Context())
	cmd, ok := m.parse(w, r)
	if !ok {
		return
	}
	if m.answerCached(cmd) { // a completed record in memory: no store access
		return
	}
	if m.cfg.Mode == ModeLease {
		m.serveLease(cmd, next)
	} else {
		m.serveTx(cmd, next)
	}
	if !cmd.reported {
		// The request's context ended while the key was claimed or
		// waited for: nothing ran to an outcome.
		m.requestEnded(cmd)
		if errors.Is(cmd.r.Context().Err(), context.DeadlineExceeded) {
			// A server-side timeout, unlike a client gone: a failure.
			m.traceFailure(cmd, context.Cause(cmd.r.Context()))
			m.reportCmd(cmd, OutcomeStoreError)
			return
		}
		m.reportCmd(cmd, OutcomeAbandoned)
	}
}

// requestEnded answers 503 when the request's context ended before the
// command could complete, before the handler ran (or while it ran, in
// ModeTx, whose writes were rolled back): nothing was executed. Its
// deadline passed (a timeout middleware in front of idem), or it was
// cancelled: the client went away, and the answer is written to no one,
// or the client is still there (a server whose BaseContext ends at
// shutdown, a client that half-closed its side of the connection) and
// must not get net/http's empty 200, which reads as success. The caller
// reports the outcome.
func (m *Middleware[TTx]) requestEnded(cmd *command) {
	m.answerEnded(cmd.w, cmd.r, cmd.key, cmd.scope)
}

// answerEnded is requestEnded's answer; scope is "" when the request
// ended before it was known (while Config.Scope ran).
func (m *Middleware[TTx]) answerEnded(w http.ResponseWriter, r *http.Request, key, scope string) {
	title, detail := "Request cancelled", "The request was cancelled before the key could be claimed or the command completed; "+
		"the command was not executed. Retry with the same key."
	if errors.Is(r.Context().Err(), context.DeadlineExceeded) {
		m.cfg.Logger.WarnContext(r.Context(), "idemhttp: the request's deadline passed before the command could complete; nothing was executed",
			"key", key, "scope", logScope(scope))
		title, detail = "Request deadline passed", "The request's deadline passed before the key could be claimed or the command completed; "+
			"the command was not executed. Retry with the same key."
	}
	w.Header().Set("Retry-After", m.retryAfter())
	problem.WriteError(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, title, detail)
}

// command is one protected request on its way through the middleware.
type command struct {
	w           http.ResponseWriter
	r           *http.Request
	key         string
	scope       string
	fingerprint []byte
	// body is the request body, read once: each run of the handler gets
	// a reader of its own (a run after a lost key must see it whole).
	body    []byte
	started time.Time
	// completed is the outcome complete stored, for the replay cache once
	// it is committed.
	completed *driver.RecordCompleteParams
	// reported: the outcome was reported (OnOutcome, the trace).
	reported bool
	// held is the key as claimed by this request, for the guard that
	// undoes the claim when a panic unwinds (see holdGuard).
	held hold
}

// parse validates the key, resolves the scope, reads the body (on Scope's
// first read of it, or after Scope) and computes
// the fingerprint. It answers the client itself when it returns false.
func (m *Middleware[TTx]) parse(w http.ResponseWriter, r *http.Request) (*command, bool) {
	reject := func(status int, typ, title, detail string) (*command, bool) {
		problem.WriteError(w, status, typ, title, detail)
		m.report(r, OutcomeRejected)
		return nil, false
	}
	key, err := ParseKey(r.Header)
	switch {
	case errors.Is(err, ErrKeyMissing):
		return reject(http.StatusBadRequest, problem.TypeKeyMissing, "Idempotency-Key header required",
			r.Method+" on this endpoint needs an Idempotency-Key header: one key per operation, reused by every retry.")
	case errors.Is(err, ErrKeyMultiple):
		return reject(http.StatusBadRequest, problem.TypeKeyMultiple, "More than one Idempotency-Key header",
			"Send exactly one Idempotency-Key header.")
	case err != nil:
		return reject(http.StatusBadRequest, problem.TypeKeyMalformed, "Malformed Idempotency-Key",
			"An Idempotency-Key is 1 to 255 visible ASCII characters (a UUID is a good choice).")
	}
	// Scope may read the body (an HMAC signature check): its first read
	// reads the whole body, up to MaxBodyBytes, and the hook gets a reader
	// of its own over the bytes, so whatever it leaves in r.Body, the
	// fingerprint and the handler cover the client's whole body. A hook
	// that does not read it answers before the body is read, as a
	// rejected client's body is not uploaded (no 100 Continue) or
	// buffered.
	scopeBody := &bodyReader{src: http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes)}
	r.Body = scopeBody
	principal, err := m.cfg.Scope(r)
	if scopeBody.read && scopeBody.err != nil {
		// The hook read the body that could not be read whole: its
		// answer may stem from that, the body's answer cannot.
		return m.rejectBody(w, r, key, scopeBody.err)
	}
	if err != nil {
		if r.Context().Err() != nil {
			// The request's context ended while the hook ran (it looked
			// the principal up with it): the credentials are not at
			// fault, and a 401, which clients do not retry, would drop
			// the operation. Answered as the other points where the
			// context ends before the claim.
			m.answerEnded(w, r, key, "")
			if errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				m.report(r, OutcomeStoreError)
			} else {
				m.report(r, OutcomeAbandoned)
			}
			return nil, false
		}
		if errors.Is(err, ErrScopeUnavailable) || dberr.Fault(err) {
			// The lookup could not be made now: not the credentials'
			// fault. Its error (an address, a host) stays in the log.
			m.cfg.Logger.WarnContext(r.Context(), "idemhttp: Config.Scope could not look the principal up; answering 503",
				"key", key, "path", r.URL.Path, "err", err)
			w.Header().Set("Retry-After", m.retryAfter())
			problem.WriteError(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, "Principal lookup unavailable",
				"The request's principal could not be looked up now; the command was not executed. Retry with the same key.")
			m.report(r, OutcomeStoreError)
			return nil, false
		}
		return reject(http.StatusUnauthorized, problem.TypeUnauthenticated, "Unauthenticated", err.Error())
	}
	if principal == "" {
		// No principal is not a principal: every such request would share
		// one key space, and a client reusing another's key would get the
		// other's stored response. Fail closed, as for a hook error.
		m.cfg.Logger.ErrorContext(r.Context(), "idemhttp: Config.Scope returned an empty principal without an error; answering 401",
			"path", r.URL.Path)
		return reject(http.StatusUnauthorized, problem.TypeUnauthenticated, "Unauthenticated",
			"The request's principal could not be identified.")
	}
	scopeBody.load()
	body := scopeBody.body
	if scopeBody.err != nil {
		return m.rejectBody(w, r, key, scopeBody.err)
	}
	if r.Body == scopeBody {
		scopeBody.rewind(body)
	} else {
		r.Body = newBodyReader(body)
	}
	route := m.cfg.Route(r)
	if route == "" && !m.emptyRouteWarned.Load() && m.emptyRouteWarned.CompareAndSwap(false, true) {
		// chi's RoutePattern read before chi routed the request (the
		// middleware mounted with r.Use on the top router) is "": the
		// scope keeps it (records stored under it must be found again),
		// but every endpoint of a principal and method shares it.
		m.cfg.Logger.WarnContext(r.Context(), "idemhttp: Config.Route returned an empty route: every endpoint of a principal and method shares one key space "+
			"(a key used on one answers 409 key-reused on another). With chi, mount the middleware on the routes "+
			"(r.With, r.Group, r.Route) rather than with r.Use on the top router, where nothing is routed yet, or leave Route to DefaultRoute",
			"method", r.Method, "path", r.URL.Path)
	}
	// The scope is per route pattern; the fingerprint covers the concrete
	// target, so one key sent to /accounts/1 and then /accounts/2 is a
	// mismatch, never a replay of the other account's response.
	fp := Fingerprint(r.Method, r.URL.RequestURI(), r.Header.Get("Content-Type"), body)
	return &command{
		w: w, r: r, key: key,
		scope:       storedScope(scopeOf(principal, r.Method, route)),
		fingerprint: fp[:],
		body:        body,
		started:     m.cfg.Now(),
	}, true
}

// rejectBody answers a body that could not be read whole (err).
func (m *Middleware[TTx]) rejectBody(w http.ResponseWriter, r *http.Request, key string, err error) (*command, bool) {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		problem.WriteError(w, http.StatusRequestEntityTooLarge, problem.TypeBodyTooLarge, "Request body too large",
			fmt.Sprintf("The body exceeds %d bytes.", m.cfg.MaxBodyBytes))
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The server's read deadline (http.Server.ReadTimeout, HTTP/1 or
		// HTTP/2) passed mid-body: a slow or stalled upload, whose client
		// is still there and reads this answer. Sending the request again
		// is what it needs to do: 408, which clients retry, not a final
		// 400.
		m.cfg.Logger.InfoContext(r.Context(), "idemhttp: request body not received within the server's read deadline", "key", key, "path", r.URL.Path, "err", err)
		problem.WriteError(w, http.StatusRequestTimeout, problem.TypeBodyTimeout, "Request body not received in time",
			"The request body did not arrive within the server's read timeout; the command was not executed. Send the request again with the same key.")
	default:
		// The error names the connection's addresses: the log has it, the
		// client does not.
		m.cfg.Logger.InfoContext(r.Context(), "idemhttp: request body unreadable", "key", key, "path", r.URL.Path, "err", err)
		problem.WriteError(w, http.StatusBadRequest, problem.TypeValidation, "Unreadable request body",
			"The request body could not be read.")
	}
	m.report(r, OutcomeRejected)
	return nil, false
}

// request returns cmd's request for one run of the handler, on ctx, with
// the body from its start.
func (cmd *command) request(ctx context.Context) *http.Request {
	r := cmd.r.WithContext(ctx)
	r.Body = newBodyReader(cmd.body)
	return r
}

// bodyReader is a request body the middleware has read: Config.Scope and
// each run of the handler get one of their own over the same bytes. One
// allocation, where io.NopCloser(bytes.NewReader(b)) costs two.
type bodyReader struct {
	r bytes.Reader
	// src, until load reads it, is the client's body (Scope's reader).
	src io.Reader
	// body is what load read of src.
	body []byte
	// err, when the middleware's read of the body failed, follows the
	// bytes read instead of io.EOF.
	err error
	// read: Read or WriteTo was called.
	read bool
}

// load reads src, once, into br's bytes.
func (br *bodyReader) load() {
	if br.src == nil {
		return
	}
	br.body, br.err = io.ReadAll(br.src)
	br.src = nil
	br.r.Reset(br.body)
}

func newBodyReader(b []byte) *bodyReader {
	br := &bodyReader{}
	br.r.Reset(b)
	return br
}

// rewind makes br read b from its start again.
func (br *bodyReader) rewind(b []byte) {
	br.r.Reset(b)
	br.read = false
}

func (br *bodyReader) Read(p []byte) (int, error) {
	br.read = true
	br.load()
	n, err := br.r.Read(p)
	if errors.Is(err, io.EOF) && br.err != nil {
		err = br.err
	}
	return n, err
}

// WriteTo keeps io.Copy's fast path of the *bytes.Reader body it replaces.
func (br *bodyReader) WriteTo(w io.Writer) (int64, error) {
	br.read = true
	br.load()
	n, err := br.r.WriteTo(w)
	if err == nil && br.err != nil {
		err = br.err
	}
	return n, err
}

// Close does nothing: the bytes stay for the next reader.
func (br *bodyReader) Close() error { return nil }

// claimParams builds the claim of cmd with a fresh lease token.
func (m *Middleware[TTx]) claimParams(cmd *command, lockTimeout time.Duration) *driver.RecordClaimParams {
	now := m.cfg.Now()
	return &driver.RecordClaimParams{
		Scope:          cmd.scope,
		Key:            cmd.key,
		Fingerprint:    cmd.fingerprint,
		LeaseToken:     newToken(),
		LeaseExpiresAt: now.Add(m.cfg.Lease),
		Now:            now,
		ExpiresAt:      now.Add(m.cfg.TTL),
		LockTimeout:    lockTimeout,
	}
}

// waitLeft is how much of the wait budget of cmd remains.
func (m *Middleware[TTx]) waitLeft(cmd *command) time.Duration {
	if m.cfg.Wait == NoWait {
		return 0
	}
	return m.cfg.Wait - m.cfg.Now().Sub(cmd.started)
}

// lockTimeout is the claim's lock wait: the remaining wait budget, at least
// one millisecond (NoWait).
func (m *Middleware[TTx]) lockTimeout(cmd *command) time.Duration {
	return max(m.waitLeft(cmd), time.Millisecond)
}

// answerExisting answers from a live record that is not ours: a mismatch or a
// replay. It returns false when the record is still in progress.
func (m *Middleware[TTx]) answerExisting(cmd *command, rec *driver.Record) bool {
	m.remember(cmd, rec) // a completed record is cached for the next retry
	if !bytes.Equal(rec.Fingerprint, cmd.fingerprint) {
		m.mismatch(cmd)
		return true
	}
	if rec.State != driver.StateCompleted {
		return false
	}
	m.replay(cmd, rec)
	return true
}

// mismatch answers a key used with another request.
func (m *Middleware[TTx]) mismatch(cmd *command) {
	m.conflict(cmd, "mismatch")
	problem.WriteError(cmd.w, m.cfg.MismatchStatus, problem.TypeKeyReused,
		"Idempotency-Key already used for another request",
		"This key was used on this endpoint with a different request target (path and query) or body. Use a new key for a new operation.")
	m.reportCmd(cmd, OutcomeMismatch)
}

// replay writes a stored response byte for byte.
func (m *Middleware[TTx]) replay(cmd *command, rec *driver.Record) {
	span := m.span(cmd, "idem.http.replay")
	defer span.End()
	h := cmd.w.Header()
	if err := decodeHeaders(rec.Headers, h); err != nil {
		m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: stored headers unreadable", "key", cmd.key, "scope", logScope(cmd.scope), "err", err)
	}
	h.Set(ReplayedHeader, "true")
	cmd.w.WriteHeader(rec.Status)
	_, _ = cmd.w.Write(rec.Body)
	m.reportCmd(cmd, OutcomeReplayed)
}

// inProgress answers 409 with Retry-After.
func (m *Middleware[TTx]) inProgress(cmd *command) {
	m.conflict(cmd, "in_progress")
	cmd.w.Header().Set("Retry-After", m.retryAfter())
	problem.WriteError(cmd.w, http.StatusConflict, problem.TypeRequestInProgress,
		"A request with this Idempotency-Key is in progress",
		"Retry with the same key after the Retry-After delay to get its result.")
	m.reportCmd(cmd, OutcomeInProgress)
}

// storeUnavailable answers 503: idem fails closed. When idem's tables are
// missing (driver.ErrNotMigrated), or PostgreSQL refuses the role a
// privilege or a login (roleRefused), it answers 500 without Retry-After
// instead, and logs the fix: retrying cannot help until an operator
// migrates, grants or fixes the credentials.
func (m *Middleware[TTx]) storeUnavailable(cmd *command, err error) {
	m.traceFailure(cmd, err)
	if errors.Is(err, driver.ErrNotMigrated) {
		m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: idem's tables are missing: run the driver's Migrate (or idemd migrate up) on this database, with the schema and table prefix the driver is configured with; every protected request fails until then",
			"key", cmd.key, "scope", logScope(cmd.scope), "err", err)
		m.notSetUp(cmd)
		return
	}
	if m.roleRefused(cmd, err) {
		return
	}
	m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: store unavailable", "key", cmd.key, "scope", logScope(cmd.scope), "err", err)
	cmd.w.Header().Set("Retry-After", m.retryAfter())
	problem.WriteError(cmd.w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable,
		"Idempotency store unavailable", "The command was not executed. Retry with the same key.")
	m.reportCmd(cmd, OutcomeStoreError)
}

// notSetUp answers 500 store-unavailable without Retry-After: the store
// is not usable until an operator acts, and nothing was executed.
func (m *Middleware[TTx]) notSetUp(cmd *command) {
	problem.WriteError(cmd.w, http.StatusInternalServerError, problem.TypeStoreUnavailable,
		"Idempotency store not set up", "The server's idempotency store is not set up; the command was not executed. "+
			"Retry with the same key once the server is fixed.")
	m.reportCmd(cmd, OutcomeStoreError)
}

// roleRefused answers 500 store-unavailable without Retry-After and
// returns true when err says PostgreSQL refused the role a privilege on
// idem's tables (42501 insufficient_privilege: a GRANT revoked) or a login
// (class 28: a password rotated, a role set NOLOGIN; dberr.Misconfigured).
// The server answered with an error, so nothing was committed (not
// outcome-unknown, even from the COMMIT's round trip), and retrying cannot
// help until an operator grants the privilege or fixes the credentials, as
// when idem's tables are missing.
func (m *Middleware[TTx]) roleRefused(cmd *command, err error) bool {
	if !dberr.Misconfigured(err) {
		return false
	}
	m.traceFailure(cmd, err)
	m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: PostgreSQL refused the application's role a privilege on idem's tables, or a login: "+
		"grant the role back what it lost on the table the error names (or fix its password or LOGIN); every protected request fails until then",
		"key", cmd.key, "scope", logScope(cmd.scope), "err", err)
	m.notSetUp(cmd)
	return true
}

// outcomeUnknown answers 503 when the commit's result is unknown.
func (m *Middleware[TTx]) outcomeUnknown(cmd *command, err error) {
	m.traceFailure(cmd, err)
	m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: commit result unknown", "key", cmd.key, "scope", logScope(cmd.scope), "err", err)
	cmd.w.Header().Set("Retry-After", m.retryAfter())
	problem.WriteError(cmd.w, http.StatusServiceUnavailable, problem.TypeOutcomeUnknown,
		"Outcome unknown", "The command may or may not have been applied. Retry with the same key: it is either replayed or executed once.")
	m.reportCmd(cmd, OutcomeStoreError)
}

// handlerTxFailed answers 500 and returns true when err says the handler
// broke the middleware's transaction: a statement of it failed and
// PostgreSQL aborted the transaction (or a deferred constraint failed at
// COMMIT), so nothing was committed; or the handler committed or rolled it
// back itself, so the record was not stored (and, when err is also
// driver.ErrTxAborted, nothing was committed: sqlitedriver turns the
// handler's COMMIT into a rollback). Either way the store is fine and a
// retry fails the same way: not 503.
func (m *Middleware[TTx]) handlerTxFailed(cmd *command, err error) bool {
	switch {
	case errors.Is(err, driver.ErrTxDone) && errors.Is(err, driver.ErrTxAborted):
		m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: the handler committed or rolled back the middleware's transaction itself; the store rolled it back: nothing was committed, and a retry executes again",
			"key", cmd.key, "scope", logScope(cmd.scope), "err", err)
		problem.WriteError(cmd.w, http.StatusInternalServerError, problem.TypeTransactionEnded,
			"Transaction ended by the handler", "The command ended the idempotency middleware's transaction itself; "+
				"nothing was committed. Retrying with the same key executes it again.")
	case errors.Is(err, driver.ErrTxAborted):
		m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: the handler's transaction was aborted by a failed statement (run statements that may fail in a savepoint: uniq.SavepointTx, uniq.SavepointSQLTx); nothing was committed",
			"key", cmd.key, "scope", logScope(cmd.scope), "err", err)
		problem.WriteError(cmd.w, http.StatusInternalServerError, problem.TypeTransactionAborted,
			"Transaction aborted", "A statement of the command failed and aborted its transaction; nothing was committed. "+
				"Retrying with the same key executes it again.")
	case errors.Is(err, driver.ErrTxDone):
		m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: the handler committed or rolled back the middleware's transaction itself; its response was not stored, and a retry executes again",
			"key", cmd.key, "scope", logScope(cmd.scope), "err", err)
		problem.WriteError(cmd.w, http.StatusInternalServerError, problem.TypeTransactionEnded,
			"Transaction ended by the handler", "The command ended the idempotency middleware's transaction itself; "+
				"its effect may have been applied and no outcome was stored for replay.")
	default:
		return false
	}
	m.traceFailure(cmd, err)
	m.reportCmd(cmd, OutcomeNotStored)
	return true
}

// idleTimedOut answers 503 store-unavailable and returns true when err
// says that PostgreSQL ended the transaction's session because it waited
// for the handler longer than idle_in_transaction_session_timeout (or
// idle_session_timeout): the server ends a session only while it waits
// for the client, so nothing was committed (not outcome-unknown), and the
// log says which setting the handler's pause outlasted.
func (m *Middleware[TTx]) idleTimedOut(cmd *command, err error) bool {
	if !dberr.IdleTimeout(err) {
		return false
	}
	m.traceFailure(cmd, err)
	m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: PostgreSQL ended the request's session: its transaction waited for the handler "+
		"(between two of its statements) longer than idle_in_transaction_session_timeout (or idle_session_timeout); "+
		"nothing was committed, and a retry executes again. Raise the setting for the application's role or database "+
		"above the handler's longest pause, or keep slow calls out of the transaction",
		"key", cmd.key, "scope", logScope(cmd.scope), "err", err)
	cmd.w.Header().Set("Retry-After", m.retryAfter())
	problem.WriteError(cmd.w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable,
		"Idempotency store unavailable", "The command was not executed. Retry with the same key.")
	m.reportCmd(cmd, OutcomeStoreError)
	return true
}

// writeTooLarge writes the 500 answer for a response too large to store.
// passNotStored sends the handler's response that is not stored (a
// failure: the key stays free for a retry). One that overflowed
// MaxResponseBytes was not kept whole: its status (and Retry-After) go out
// with a problem body instead, saying "stored": false.
func (m *Middleware[TTx]) passNotStored(cmd *command, rec *recorder) {
	if m.cfg.Tracer != nil && rec.statusCode() >= 500 {
		// A server error, as HTTP's semantic conventions count it.
		m.traceFailure(cmd, fmt.Errorf("idemhttp: the handler answered %d; not stored", rec.statusCode()))
	}
	if !rec.overflow {
		rec.flush(cmd.w)
		return
	}
	m.cfg.Logger.WarnContext(cmd.r.Context(), "idemhttp: failure response too large to pass on", "key", cmd.key, "scope", logScope(cmd.scope),
		"status", rec.statusCode(), "limit", m.cfg.MaxResponseBytes)
	if ra := rec.header.Get("Retry-After"); ra != "" {
		cmd.w.Header().Set("Retry-After", ra)
	}
	// "stored": false tells this answer from the stored (or
	// configuration) 500 response-too-large: a client may retry it.
	problem.Write(cmd.w, problem.Problem{Type: problem.TypeResponseTooLarge, Title: "Response too large",
		Status:     rec.statusCode(),
		Detail:     "The command failed and its response was too large to pass on; nothing was stored: retry with the same key.",
		Extensions: map[string]any{"stored": false}})
}

func (m *Middleware[TTx]) writeTooLarge(w http.ResponseWriter, cmd *command, detail string) {
	m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: response too large to store", "key", cmd.key, "scope", logScope(cmd.scope), "limit", m.cfg.MaxResponseBytes)
	problem.WriteError(w, http.StatusInternalServerError, problem.TypeResponseTooLarge,
		"Response too large to store", detail)
}

// complete stores rec's outcome through ex.
func (m *Middleware[TTx]) complete(ctx context.Context, ex driver.RecordExecutor, cmd *command, token string, rec *recorder) error {
	headers, err := encodeHeaders(rec.header, m.replayHeaders)
	if err != nil {
		return err
	}
	p := &driver.RecordCompleteParams{
		Scope: cmd.scope, Key: cmd.key, LeaseToken: token,
		Status: rec.statusCode(), Headers: headers, Body: rec.body.Bytes(),
	}
	cmd.completed = p
	return ex.RecordComplete(ctx, p)
}

// pause sleeps d or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	if !backoff.Sleep(ctx, d, nil) {
		return ctx.Err()
	}
	return nil
}

// pollDelay is the n-th delay between two looks at an in-progress record.
func pollDelay(n int) time.Duration {
	return min(10*time.Millisecond<<min(n, 5), 250*time.Millisecond)
}

func (m *Middleware[TTx]) retryAfter() string {
	return strconv.Itoa(int((m.cfg.RetryAfter + time.Second - 1) / time.Second))
}

// reportCmd reports cmd's outcome (once per request: see serve).
func (m *Middleware[TTx]) reportCmd(cmd *command, o Outcome) {
	cmd.reported = true
	m.report(cmd.r, o)
}

func (m *Middleware[TTx]) report(r *http.Request, o Outcome) {
	if m.cfg.Tracer != nil {
		traceOutcome(r, o)
	}
	if m.cfg.OnOutcome != nil {
		m.cfg.OnOutcome(r, o)
	}
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
