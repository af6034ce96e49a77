package idemhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/observe"
)

// Mode selects how a claimed command executes.
type Mode int

const (
	// ModeTx (the default) runs the claim, the handler's writes and the
	// stored response in ONE database transaction. The handler gets the
	// transaction with TxFromContext. A crash at any point leaves either
	// everything (effect and record) or nothing, and a retry then replays or
	// executes. Use it whenever the handler's effect is in the same database.
	ModeTx Mode = iota
	// ModeLease claims the key with an in-progress record and a lease that
	// the middleware renews while the handler runs, then stores the response
	// in a second statement. Use it when the effect is outside the database
	// (a call to a payment provider). Trade-off: if the process dies after
	// the external effect and before the response is stored, the lease
	// expires and a retry executes again; pass the Idempotency-Key (or a key
	// derived from it) to the downstream system to close that window.
	ModeLease
)

func (m Mode) String() string {
	switch m {
	case ModeTx:
		return "tx"
	case ModeLease:
		return "lease"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// NoWait as Config.Wait answers a duplicate of an in-flight request at once
// with 409 and Retry-After, instead of waiting for the first one's outcome.
const NoWait time.Duration = -1

// DefaultCommitTimeout is Config.CommitTimeout's default.
const DefaultCommitTimeout = 30 * time.Second

// TTL bounds of R-DIST-IDEM-5.
const (
	MinTTL = 24 * time.Hour
	MaxTTL = 72 * time.Hour
)

// Config configures a Middleware. The zero value gives the defaults.
type Config struct {
	// Mode selects transaction-bound or lease execution. Defaults to ModeTx.
	Mode Mode

	// Methods are the protected methods: a request with one of them must
	// carry an Idempotency-Key. Other methods pass through untouched.
	// Defaults to POST and PATCH.
	Methods []string

	// TTL is how long a record deduplicates after it was created. Defaults
	// to 24h. A TTL outside 24h..72h (R-DIST-IDEM-5) is rejected unless
	// TTLOverrideReason says why.
	TTL time.Duration
	// TTLOverrideReason allows a TTL outside 24h..72h; it is logged at start.
	TTLOverrideReason string

	// Scope returns the principal (tenant, API client) a key belongs to. Keys
	// are looked up per principal, method and route, so one client can never
	// receive another client's stored response. An error answers 401
	// unauthenticated, before the key is claimed, with the error's text as
	// the problem's detail: the client reads it. An empty principal
	// returned without an error is refused the same way (401): it would
	// put every request without one in a single shared key space. An
	// error returned once the request's context has ended (a lookup made
	// with it, cut by a timeout middleware's deadline or a cancellation)
	// answers 503 store-unavailable with Retry-After instead, as the
	// credentials were not at fault. So does an error that says the
	// lookup could not be made now: one wrapping ErrScopeUnavailable (a
	// key store unreachable), or a database's (a refused or lost
	// connection, a timeout, a privilege refused), with a detail of its
	// own rather than the error's text, which is logged at WARN. Any other
	// error is the credentials' (401, its text sent).
	//
	// Set it to the authenticated principal's stable ID (what your
	// authentication middleware found). The default, DefaultScope, is a
	// hash of the Authorization header: a client that refreshes its token
	// between two attempts of one operation gets a new scope, and its retry
	// executes again; requests authenticated another way (cookies, mTLS,
	// an API-key header) all share the anonymous scope; and the hash is a
	// fast, unsalted one, kept in every record and log line of the key: of
	// a guessable credential (HTTP Basic with a password) it lets whoever
	// reads the table or the logs find the password offline. New logs a
	// warning when Scope is not set.
	//
	// Scope may read r.Body (an authenticator checking an HMAC signature
	// over it) and leave it read, closed or replaced: its first read has
	// the middleware read the whole body, up to MaxBodyBytes, and Scope
	// gets a reader of its own over those bytes, so the fingerprint and the
	// handler always see the client's whole body. A body over MaxBodyBytes
	// reads as its first MaxBodyBytes bytes and then an
	// *http.MaxBytesError. When the body could not be read whole, a hook
	// that read it gets the body's answer (413, 408 for the server's read
	// deadline passed, or 400 for a connection broken mid-body) instead of
	// its own. A hook that does not read it
	// answers before the body is read (401 on an error): a rejected
	// client's body is neither uploaded nor buffered.
	//
	// A scope (principal, method and route together) longer than 2 KiB, not
	// valid UTF-8 or containing a NUL byte is stored as "h:" and its hex
	// SHA-256, which PostgreSQL can store.
	Scope func(*http.Request) (string, error)
	// Route names the endpoint for the scope (keys are looked up per
	// principal, method and route). The fingerprint does not use it: it
	// covers the method, the request target (path and query) and the body,
	// so one key sent to /accounts/1 and then /accounts/2 is a mismatch.
	// Defaults to DefaultRoute: the ServeMux pattern, or the URL path when
	// the request was not routed by a ServeMux. chi sets Request.Pattern
	// too (checked with v5.5.0), once it has routed the request: with the
	// middleware mounted on the routes (r.With, r.Group, r.Route)
	// DefaultRoute gives chi's pattern. Mounted with r.Use on the top
	// router, the middleware runs before chi routes: DefaultRoute gives
	// the URL path, and chi's RouteContext(ctx).RoutePattern() is still
	// "". A Route that returns "" puts every endpoint of a principal and
	// method in one scope (a key used on one answers 409 key-reused on
	// another); the middleware logs a warning the first time.
	Route func(*http.Request) string

	// MaxBodyBytes caps the request body read for the fingerprint; a larger
	// body answers 413. Defaults to 1 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes caps the stored response body. A larger successful
	// response is never silently left unstored: in ModeTx the command is
	// rolled back and answers 500; in ModeLease (its effect happened) a 500
	// response-too-large is stored under the key, so a retry cannot run the
	// effect again. A larger failure is passed on and not stored. Defaults
	// to 1 MiB.
	MaxResponseBytes int

	// ReplayHeaders are response headers stored and replayed in addition to
	// Content-Type, Content-Encoding, Content-Language, Location,
	// Cache-Control and X-Content-Type-Options (which every problem
	// document carries).
	// Set-Cookie is only replayed when listed here. Content-Length,
	// Transfer-Encoding and Idempotent-Replayed, which the replay sets
	// itself, are refused, and so are the CORS response headers
	// (Access-Control-*), which belong to each request's Origin: a CORS
	// middleware goes outside this one (see the package documentation,
	// Browser clients). List no header that describes one request rather
	// than the operation's result (a request ID, a trace header, Date): a
	// replay would send the first request's. A listed Vary is added to the
	// Vary an outer middleware set, as the handler's is on the first
	// answer. Defaults to none.
	//
	// The trailers of the listed names are stored and replayed as
	// trailers: those declared in a Trailer header and those set with
	// http.TrailerPrefix, as net/http sends them. List Trailer too to
	// replay the declaration itself.
	ReplayHeaders []string

	// Store decides which outcomes are stored and replayed. Defaults to
	// DefaultStore: every status below 500 except 408, 425 and 429.
	// Outcomes not stored roll back (ModeTx) or release the key (ModeLease)
	// so that a retry executes again. It runs with the key held (in ModeTx
	// with the transaction open): a panic of it rolls back or releases the
	// key, as the handler's does.
	Store func(status int) bool

	// MismatchStatus answers a reused key with another request. Defaults to
	// 409 (rule R-DIST-IDEM-3); 422 follows the IETF idempotency-key draft.
	MismatchStatus int

	// Wait is how long a duplicate of an in-flight request waits for its
	// outcome before answering 409 with Retry-After. Defaults to 5s; NoWait
	// answers at once. At most 1h. On PostgreSQL the wait is bounded by a
	// lock_timeout of Wait, and the role's statement_timeout is off for it
	// (a shorter one would cut it short). In ModeTx on a driver.TxClaimer
	// (idem's drivers) one duplicate per key and middleware waits in the
	// store, holding a connection; the others wait in memory for its turn,
	// so that copies of one slow request cannot take every connection of
	// the pool from other principals. Count those connections when sizing
	// a small pool: a handler that takes a second connection besides its
	// transaction's (a read on the *sql.DB or pool instead of
	// TxFromContext's transaction) waits for one while duplicates hold the
	// others, up to Wait, and the duplicate then answers 409 instead of the
	// replay (a pool of 2: 2.8s of a 3s Wait, for one duplicate).
	//
	// Wait bounds the wait for the key's lock, not for a connection of
	// the pool: with every connection taken (slow handlers, a stalled
	// database), a request, new or a duplicate, waits for one for as long
	// as its context lives. Give requests a deadline (a timeout
	// middleware in front of this one; idemd's -request-timeout): when it
	// passes they answer 503 store-unavailable with Retry-After, their
	// handlers not run. (On SQLite a request waits at most Wait for the
	// database's only connection, then answers 409.)
	Wait time.Duration
	// RetryAfter is the Retry-After sent with 409 request-in-progress and
	// 503 answers. Defaults to 1s.
	RetryAfter time.Duration

	// Lease is how long a ModeLease claim lives without renewal; the
	// middleware renews it every Lease/3 while the handler runs (a failed
	// renewal is retried after 100ms, doubling up to Lease/3), so only a
	// dead owner's claim expires. When a renewal finds the lease taken, or
	// renewals failed until it ended (the store unreachable), the
	// handler's context is cancelled with the cause driver.ErrLeaseLost:
	// another request may run the command now. Defaults to 30s; at least
	// 1s.
	Lease time.Duration

	// CommitTimeout bounds the store's work after the handler returned,
	// which goes on when the client has gone (the request's context does
	// not end it): in ModeTx the COMMIT with the stored response (on the
	// generic path also the record's write before it), in ModeLease each
	// attempt to store the outcome (three at most, each also bounded by
	// Lease/3). A store that stops answering there (a network partition
	// that closes nothing, a hung server) would otherwise hold the
	// request, its connection and the key until the operating system gave
	// up on the socket, hours later. When it passes in ModeTx the COMMIT may or may
	// not have happened: the request answers 503 outcome-unknown, the
	// connection is given up, and a retry with the same key replays what
	// was committed or executes once. A COMMIT that never reached
	// PostgreSQL leaves the key locked by its session, and its retries
	// answered 409 request-in-progress, until PostgreSQL sees the
	// connection gone (docs/problems.md, outcome-unknown). Set it above
	// the slowest COMMIT expected (synchronous replication, deferred
	// triggers). database/sql's Tx.Commit takes no context: with
	// pgsqldriver and sqlitedriver it bounds the record's write, not the
	// COMMIT (pgsqldriver's runs on the request's context).
	// Defaults to DefaultCommitTimeout (30s); negative is rejected.
	CommitTimeout time.Duration

	// ReplayCacheBytes bounds the in-process cache of completed responses
	// that answers a retry (a replay, or a mismatch) without touching the
	// store. A completed record never changes until it expires, so the
	// cache needs no invalidation between instances. Defaults to
	// DefaultReplayCacheBytes (32 MiB); a response accounted above 1/128 of
	// it is not cached; NoReplayCache (any negative value) disables it.
	// A full cache keeps about 1.2 times it on the heap (its maps' and
	// allocations' overhead), whatever the number of keys: count that per
	// middleware when sizing a process's memory.
	// Deleting a record by hand (to let a key execute again) then also
	// requires restarting the instances or waiting for the record's expiry.
	ReplayCacheBytes int64

	// OnOutcome, if set, is called once per protected request with what
	// idem did (for metrics).
	OnOutcome func(r *http.Request, o Outcome)
	// Tracer, if set, traces every protected request with an
	// idem.http.request span (attributes http.request.method, http.route
	// (Route's value, the path template alone when that is the request's
	// ServeMux pattern: "/orders/{id}" for "POST /orders/{id}"; absent when
	// Route is DefaultRoute and no ServeMux routed the request: a path is
	// not a template), idem.outcome and idem.replayed; never the key, a
	// header or a body)
	// and its children idem.http.claim, idem.http.execute (the handler's
	// context, so the events it enqueues carry this trace),
	// idem.http.replay and idem.http.conflict. A failure of the store or
	// of the command's transaction that decides the answer (503, 500
	// transaction-aborted), or a 5xx of the handler, is recorded on the
	// request span, and on the claim or execute span it happened in. The
	// span is a child of the
	// request context's span: continue an incoming traceparent before the
	// middleware (otelhttp, or an observe.Propagator's Extract). Nil (the
	// default) traces nothing and allocates nothing.
	Tracer observe.Tracer
	// Logger receives warnings and errors. Those about a request are
	// logged with its context (slog's Context variants), so that a
	// handler can add what the context carries, such as the IDs of its
	// span. Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock. The times of a record (its lease, its expiry) are
	// written by one replica and compared by another, on other hosts
	// whose clocks may disagree. Defaults to the host's clock corrected
	// by the database's when the driver is a driver.Clock (idem's drivers
	// are), measured again every 10s at most with one query: replicas
	// then agree on the database's time whatever their hosts' clocks say,
	// and a host more than 1s off is logged (WARN "this host's clock
	// disagrees with the database's"). A Now set here is used as is: the
	// replicas' clocks must then agree within 2/3 of Lease (what a
	// renewal leaves of it: beyond, a retry on a replica ahead, or on any
	// replica while the owner's clock is behind, takes the key over while
	// its handler runs, and the command executes twice), and well within
	// TTL (a replica more than TTL ahead executes every retry again).
	Now func() time.Time
}

// DefaultStore stores deterministic outcomes: every status below 500 except
// 408 Request Timeout, 425 Too Early and 429 Too Many Requests, which say
// "try again later" and must not be replayed.
func DefaultStore(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

func (c Config) withDefaults() Config {
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if c.TTL == 0 {
		c.TTL = MinTTL
	}
	if c.Scope == nil {
		c.Scope = DefaultScope
	}
	if c.Route == nil {
		c.Route = DefaultRoute
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 1 << 20
	}
	if c.Store == nil {
		c.Store = DefaultStore
	}
	if c.MismatchStatus == 0 {
		c.MismatchStatus = http.StatusConflict
	}
	if c.Wait == 0 {
		c.Wait = 5 * time.Second
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = time.Second
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = DefaultCommitTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ReplayCacheBytes == 0 {
		c.ReplayCacheBytes = DefaultReplayCacheBytes
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Mode != ModeTx && c.Mode != ModeLease {
		errs = append(errs, fmt.Errorf("unknown Mode %d", int(c.Mode)))
	}
	for _, h := range c.ReplayHeaders {
		// Set by the replay itself: stored too, a replay would send them twice.
		switch name := http.CanonicalHeaderKey(h); {
		case name == "Content-Length", name == "Transfer-Encoding", name == ReplayedHeader:
			errs = append(errs, fmt.Errorf("ReplayHeaders: %s is set by the replay itself", name))
		case strings.HasPrefix(name, "Access-Control-"):
			// Each request's own (its Origin's): replayed, a retry from
			// another origin gets the first one's, and its browser
			// refuses the answer.
			errs = append(errs, fmt.Errorf("ReplayHeaders: %s belongs to each request's Origin, not to the stored response: put the CORS middleware outside this one (wrapping it), which also lets the browser read this middleware's own answers", name))
		}
	}
	for _, m := range c.Methods {
		if !isMethodToken(m) || strings.ToUpper(m) != m {
			// " PATCH" (from a split list) would leave every PATCH
			// unprotected.
			errs = append(errs, fmt.Errorf("method %q must be an upper-case HTTP method token", m))
		}
	}
	if c.TTL <= 0 {
		errs = append(errs, fmt.Errorf("TTL %s must be positive", c.TTL))
	} else if (c.TTL < MinTTL || c.TTL > MaxTTL) && strings.TrimSpace(c.TTLOverrideReason) == "" {
		errs = append(errs, fmt.Errorf("TTL %s is outside %s..%s (R-DIST-IDEM-5): shorter lets a late client retry execute twice, longer grows the table; set TTLOverrideReason to allow it", c.TTL, MinTTL, MaxTTL))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBodyBytes %d must not be negative", c.MaxBodyBytes))
	}
	if c.MaxResponseBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxResponseBytes %d must not be negative", c.MaxResponseBytes))
	}
	if c.MismatchStatus != http.StatusConflict && c.MismatchStatus != http.StatusUnprocessableEntity {
		errs = append(errs, fmt.Errorf("MismatchStatus %d must be 409 or 422", c.MismatchStatus))
	}
	if c.Wait < 0 && c.Wait != NoWait {
		errs = append(errs, fmt.Errorf("invalid Wait %s: must be positive or NoWait", c.Wait))
	}
	if c.Wait > maxWait {
		errs = append(errs, fmt.Errorf("invalid Wait %s: at most %s (a request would hold its connection that long)", c.Wait, maxWait))
	}
	if c.RetryAfter < time.Second {
		errs = append(errs, fmt.Errorf("RetryAfter %s must be at least 1s (Retry-After has whole seconds)", c.RetryAfter))
	}
	if c.Lease < time.Second {
		errs = append(errs, fmt.Errorf("invalid Lease %s: must be at least 1s", c.Lease))
	}
	if c.CommitTimeout < 0 {
		errs = append(errs, fmt.Errorf("invalid CommitTimeout %s: must not be negative (zero is the default, %s)", c.CommitTimeout, DefaultCommitTimeout))
	}
	if c.Lease >= c.TTL {
		errs = append(errs, fmt.Errorf("invalid Lease %s: must be shorter than TTL %s", c.Lease, c.TTL))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemhttp: invalid config: %w", err)
	}
	return nil
}

// replayHeaders returns the canonical names of the headers stored for replay.
func (c Config) replayHeaders() []string {
	hs := []string{"Content-Type", "Content-Encoding", "Content-Language", "Location", "Cache-Control", "X-Content-Type-Options"}
	for _, h := range c.ReplayHeaders {
		h = http.CanonicalHeaderKey(h)
		if !slices.Contains(hs, h) {
			hs = append(hs, h)
		}
	}
	return hs
}

// maxWait bounds Config.Wait: PostgreSQL's lock_timeout, which carries it,
// takes at most 2^31-1 ms, and no client waits longer than this anyway.
const maxWait = time.Hour

// isMethodToken reports whether m is an HTTP method token (RFC 9110).
func isMethodToken(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
