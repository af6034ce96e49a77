package idemclient

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/google/uuid"

	"github.com/idemkit/idem/problem"
)

// Header names.
const (
	// HeaderKey carries the key of the operation a request belongs to.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is "true" on a response the server replayed from an
	// earlier attempt instead of executing the request again.
	HeaderReplayed = "Idempotent-Replayed"
)

// MaxKeyLen is the longest key idemhttp accepts.
const MaxKeyLen = 255

// drainLimit bounds how much of a retried response's body is read so the
// connection can be reused; peekLimit bounds how much of a 409, 422 or 500
// body is read to find its problem type.
const (
	drainLimit = 64 << 10
	peekLimit  = 64 << 10
)

// ErrBodyTooLarge is returned, before anything is sent, for a retryable
// request without GetBody whose body exceeds Config.MaxBodyBytes.
var ErrBodyTooLarge = errors.New("idemclient: request body larger than MaxBodyBytes")

// ErrKeyReused matches a *KeyReusedError with errors.Is.
var ErrKeyReused = errors.New("idemclient: Idempotency-Key reused for a different request")

// KeyReusedError is returned by Do when the server answers key-reused (409,
// or 422 with idemhttp's MismatchStatus): the key was first used with a
// different request. It is a programming error and is never retried: the
// operation already has an outcome under this key, and a different request
// needs a new key (see docs/problems.md#key-reused).
type KeyReusedError struct {
	// Key is the key the server refused.
	Key string
	// StatusCode is 409 or 422.
	StatusCode int
	// Problem is the server's problem details.
	Problem problem.Problem
}

func (e *KeyReusedError) Error() string {
	s := fmt.Sprintf("idemclient: Idempotency-Key %q reused for a different request (status %d)", e.Key, e.StatusCode)
	if e.Problem.Detail != "" {
		s += ": " + e.Problem.Detail
	}
	return s
}

// Is makes errors.Is(err, ErrKeyReused) true.
func (e *KeyReusedError) Is(target error) bool { return target == ErrKeyReused }

// ErrRetryAfter matches a *RetryAfterError with errors.Is.
var ErrRetryAfter = errors.New("idemclient: the server asked to retry later than Do may wait")

// RetryAfterError is the cause, in the *Error Do returns, when a retryable
// response asked (Retry-After) for a wait Do may not make: one longer than
// Config.MaxRetryAfter, or ending after the request context's deadline or
// Config.MaxElapsed. Do does not retry sooner than the server asked, which
// would only add load to a server that said it cannot serve until then: it
// stops at once, drains and closes that response, and returns this. The
// operation has no outcome yet (or an unknown one): re-issue it with the
// same key (Error.Key), not before At.
type RetryAfterError struct {
	// StatusCode is the status of the last response, and ProblemType its
	// problem type URI, if it had one.
	StatusCode  int
	ProblemType string
	// RetryAfter is the wait the server asked for, and At its end.
	RetryAfter time.Duration
	At         time.Time
	// Limit says, for humans, what the wait goes past: MaxRetryAfter,
	// the context's deadline or MaxElapsed.
	Limit string
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("response %d %s asks to retry in %s, past %s", e.StatusCode, http.StatusText(e.StatusCode), e.RetryAfter, e.Limit)
}

// Is makes errors.Is(err, ErrRetryAfter) true, and errors.Is(err,
// ErrInProgress) too when the response was a 409 request-in-progress.
func (e *RetryAfterError) Is(target error) bool {
	return target == ErrRetryAfter || target == ErrInProgress && e.inProgress()
}

// inProgress reports whether the response was a 409 request-in-progress.
func (e *RetryAfterError) inProgress() bool {
	return e.StatusCode == http.StatusConflict && e.ProblemType == problem.TypeRequestInProgress
}

// ErrInProgress is the cause (in an *Error) when Do ran out of attempts,
// or of time for another one, while the server still answered 409
// request-in-progress: an earlier attempt, or another request with the same
// key, is still running there, and its outcome is not known yet. It is not
// a conflict: re-issue the operation later with the same key (the server
// then replays the stored outcome), never with a new one. When the 409's
// Retry-After was the wait Do could not make (past MaxRetryAfter, the
// context's deadline or MaxElapsed), the cause is a *RetryAfterError,
// which errors.Is matches with ErrInProgress as well as ErrRetryAfter; when
// the context ended during the wait or the attempt after such a 409, the
// cause wraps both the context's error and ErrInProgress.
var ErrInProgress = errors.New("idemclient: the operation is still in progress on the server; re-issue it later with the same key")

// Error is returned by Do when the last attempt ended without a response (a
// transport error), the request's context ended, or the server asked for a
// longer wait than Do may make (a *RetryAfterError). Re-issue the operation
// later with the same Key: the server may have executed it.
type Error struct {
	// Method and URL of the request. The URL has no user info, query or
	// fragment: they may hold secrets, and error messages end up in logs.
	Method, URL string
	// Key is the Idempotency-Key of every attempt, "" if none.
	Key string
	// Attempts is the number of attempts made: each passed the request to
	// Config.HTTPClient. One that net/http refused before sending anything
	// (the context already ended, a request it cannot send) counts, so the
	// server may have seen fewer.
	Attempts int
	// Err is the cause: the last transport error, the context's error
	// wrapped together with the last outcome, a *RetryAfterError, or
	// ErrInProgress. A
	// *url.Error in it names the URL without user info, query or fragment
	// too.
	Err error
}

func (e *Error) Error() string {
	k := ""
	if e.Key != "" {
		k = fmt.Sprintf(", Idempotency-Key %q", e.Key)
	}
	return fmt.Sprintf("idemclient: %s %s: %d attempt(s)%s: %v", e.Method, e.URL, e.Attempts, k, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// NewKey returns a fresh key for one business operation: a UUIDv7, which
// sorts by creation time, so that an idem server adds its record at the
// right edge of its index (random UUIDv4 keys change a random index page
// each: with 10 million records, about five times the WAL per request; see
// the README's "Volume: sizing and autovacuum"). Store it with the operation
// before the first attempt; see the package documentation.
func NewKey() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("idemclient: new key: %w", err)
	}
	return u.String(), nil
}

// WithKey returns a shallow copy of req (see http.Request.Clone; the body is
// shared) carrying key as its Idempotency-Key, replacing any it had. The key
// must be 1 to 255 visible ASCII characters other than the double quote.
func WithKey(req *http.Request, key string) (*http.Request, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	r := req.Clone(req.Context())
	if r.Header == nil { // a hand-built request: http.Client accepts it
		r.Header = http.Header{}
	}
	setKey(r.Header, key)
	return r, nil
}

// setKey sets key as h's only Idempotency-Key, removing any under another
// spelling of the name (a Header map written directly).
func setKey(h http.Header, key string) {
	for name := range h {
		if strings.EqualFold(name, HeaderKey) {
			delete(h, name)
		}
	}
	h.Set(HeaderKey, key)
}

// keyValues returns the Idempotency-Key values of h under any spelling of
// the name: net/http sends each of them.
func keyValues(h http.Header) []string {
	var vs []string
	for name, v := range h {
		if strings.EqualFold(name, HeaderKey) {
			vs = append(vs, v...)
		}
	}
	return vs
}

// Replayed reports whether resp was replayed by the server from an earlier
// attempt (Idempotent-Replayed: true) rather than executed now. A response
// reached through a 303 See Other (the http.Client follows it with a GET)
// is the command's answer read elsewhere: Replayed reports whether that
// 303 was a replay.
func Replayed(resp *http.Response) bool {
	for r := resp; r != nil; {
		if (r == resp || r.StatusCode == http.StatusSeeOther) &&
			strings.EqualFold(strings.TrimSpace(r.Header.Get(HeaderReplayed)), "true") {
			return true
		}
		if r.Request == nil {
			break
		}
		r = r.Request.Response // the redirect that led to r, if any
	}
	return false
}

func checkKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("idemclient: Idempotency-Key must be 1 to %d characters, got %d", MaxKeyLen, len(key))
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c < 0x21 || c > 0x7e {
			return fmt.Errorf("idemclient: Idempotency-Key byte 0x%02x at offset %d is not visible ASCII", c, i)
		}
		if c == '"' {
			// Sent bare, a quote is refused by the server (400
			// key-malformed); a key in quotes is read as an RFC 8941
			// string, another key than the one reported.
			return fmt.Errorf("idemclient: Idempotency-Key has a double quote at offset %d", i)
		}
	}
	return nil
}

// Client sends requests with one Idempotency-Key per operation and retries
// them with it. It is safe for concurrent use.
type Client struct {
	cfg Config
	// int64N draws the jitter added to a Retry-After: uniform in [0, n)
	// (rand.Int64N; a test's own, to know the wait).
	int64N func(n int64) int64
}

// New returns a client. cfg may be nil for the defaults; an invalid cfg is
// an error.
func New(cfg *Config) (*Client, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Client{cfg: c, int64N: rand.Int64N}, nil
}

// NewKey returns a key from the client's Config.NewKey.
func (c *Client) NewKey() (string, error) {
	key, err := c.cfg.NewKey()
	if err != nil {
		return "", fmt.Errorf("idemclient: new key: %w", err)
	}
	if err := checkKey(key); err != nil {
		return "", fmt.Errorf("idemclient: Config.NewKey: %w", err)
	}
	return key, nil
}

// idempotent are the methods RFC 9110 defines as idempotent.
var idempotent = []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions, http.MethodTrace}

// Do sends req, adding an Idempotency-Key when its method needs one, and
// retries it with the same key and body as the package documentation
// describes. req is not modified; the attempts are clones of it carrying
// req's context. Like http.Client.Do, Do closes req.Body. req passed to Do
// again is the same operation: it is sent with the key Do generated for it
// and the body Do read from it the first time (see "Retry helpers of your
// own" in the package documentation).
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	key, err := c.key(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if key == "" && !slices.Contains(idempotent, method(req)) {
		// A keyless non-idempotent request: exactly one attempt. Its
		// transport error is an *Error too, without the URL's query.
		resp, err := c.httpClient().Do(req)
		if err != nil {
			// resp is not nil only when CheckRedirect failed, and then
			// its body is already closed.
			return nil, &Error{Method: method(req), URL: logURL(req), Attempts: 1, Err: redactErr(err)}
		}
		return resp, nil
	}
	getBody, err := c.bodySource(req)
	if err != nil {
		return nil, err
	}
	return c.loop(req, key, getBody)
}

// httpClient is Config.HTTPClient with a redirect policy that keeps a
// command from turning into a GET: a 301 or 302 answering a method other
// than GET and HEAD is not followed (http.Client would follow it as a GET
// without the body, so the command would never run and the GET's answer
// would come back as its outcome); the 3xx is returned instead. 303 See
// Other (the command ran, its result is elsewhere), 307 and 308 (the same
// method and body) are followed. Config.HTTPClient's own CheckRedirect, or
// http.Client's default of 10 redirects, applies to the rest.
func (c *Client) httpClient() *http.Client {
	hc := *c.cfg.HTTPClient
	next := hc.CheckRedirect
	hc.CheckRedirect = func(r *http.Request, via []*http.Request) error {
		if r.Response != nil && r.Response.StatusCode != http.StatusSeeOther &&
			len(via) > 0 && method(r) != method(via[len(via)-1]) {
			return http.ErrUseLastResponse
		}
		if next != nil {
			return next(r, via)
		}
		if len(via) >= 10 { // http.Client's default policy
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &hc
}

// key returns the request's key, or a new one when its method needs one,
// or "".
func (c *Client) key(req *http.Request) (string, error) {
	switch vs := keyValues(req.Header); {
	case len(vs) > 1:
		return "", fmt.Errorf("idemclient: %d Idempotency-Key headers; send exactly one", len(vs))
	case len(vs) == 1:
		key := strings.TrimSpace(vs[0])
		if key == "" {
			return "", errors.New("idemclient: empty Idempotency-Key header")
		}
		if err := checkKey(key); err != nil {
			return "", err
		}
		return key, nil
	}
	if !slices.Contains(c.cfg.Methods, method(req)) {
		return "", nil
	}
	if key, ok := generatedKeys.load(req); ok {
		// The request was passed to Do before (a retry helper of the
		// caller's): the same operation, under the same key.
		return key, nil
	}
	key, err := c.NewKey()
	if err != nil {
		return "", err
	}
	return generatedKeys.keep(req, key), nil
}

// method is req's method; "" is GET, as net/http sends it.
func method(req *http.Request) string {
	if req.Method == "" {
		return http.MethodGet
	}
	return req.Method
}

// bodySource returns a function giving the body of each attempt, the same
// bytes every time, or nil for a request without body.
func (c *Client) bodySource(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		// Every attempt, the first included, reads a fresh copy: a request
		// passed to Do again (its Body already read) still sends its body.
		_ = req.Body.Close()
		return req.GetBody, nil
	}
	if rb, ok := bufferedBodies.load(req); ok && rb.from.is(req.Body) {
		// The request was passed to Do before, which read its body (it
		// reads nothing now, or only what followed MaxBodyBytes): the
		// same operation, with the same bytes, or the same refusal.
		_ = req.Body.Close()
		if rb.err != nil {
			return nil, rb.err
		}
		return bytesBody(rb.b), nil
	}
	from := req.Body
	b, err := c.readBodyCtx(req.Context(), from, req.ContentLength)
	bufferedBodies.set(req, readBody{from: bodyIdentity(from), b: b, err: err})
	if err != nil {
		return nil, err
	}
	return bytesBody(b), nil
}

// readBodyCtx is readBody within ctx: when ctx ends first (a body that
// stalls, such as an incoming request's a gateway forwards), it closes body
// and returns ctx's error, as http.Client.Do would; the read, which the
// close ends for most bodies, finishes on its own.
func (c *Client) readBodyCtx(ctx context.Context, body io.ReadCloser, contentLength int64) ([]byte, error) {
	if ctx.Done() == nil || ctx.Err() != nil {
		// A context that never ends, or has ended: the attempt reports it.
		return c.readBody(body, contentLength)
	}
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := c.readBody(body, contentLength)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-ctx.Done():
		select {
		case r := <-done: // read meanwhile
			return r.b, r.err
		default:
		}
		_ = body.Close()
		return nil, fmt.Errorf("idemclient: read request body: %w", ctx.Err())
	}
}

// readBody reads and closes body, at most MaxBodyBytes of it.
func (c *Client) readBody(body io.ReadCloser, contentLength int64) ([]byte, error) {
	// min: MaxBodyBytes+1 must not overflow (math.MaxInt64 for "no limit").
	b, err := io.ReadAll(io.LimitReader(body, min(c.cfg.MaxBodyBytes, math.MaxInt64-1)+1))
	_ = body.Close()
	if err != nil {
		return nil, fmt.Errorf("idemclient: read request body: %w", err)
	}
	if int64(len(b)) > c.cfg.MaxBodyBytes {
		return nil, fmt.Errorf("%w (%d bytes; set GetBody or raise the limit)", ErrBodyTooLarge, c.cfg.MaxBodyBytes)
	}
	if contentLength > 0 && contentLength != int64(len(b)) {
		// net/http would refuse every attempt.
		return nil, fmt.Errorf("idemclient: request ContentLength %d, but its body has %d bytes", contentLength, len(b))
	}
	return b, nil
}

// bytesBody gives b as the body of each attempt.
func bytesBody(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// A request passed to Do again (by a retry helper of the caller's that
// wraps Do) is a retry of the same operation: Do sends it under the key it
// generated for it the first time, and with the body it read from it then
// (its Body reads nothing now), for as long as the request lives. A new
// key would execute the operation a second time when an earlier attempt
// had executed it. The entries are keyed by weak pointers, so that they go
// with their request; the request itself is not modified.
var (
	generatedKeys  requestMemo[string]
	bufferedBodies requestMemo[readBody]
)

// readBody is what Do read from a request's Body (the bytes, or why it
// refused them), and which Body that was.
type readBody struct {
	from bodyID
	b    []byte
	err  error
}

// bodyID identifies a request's Body without keeping it alive when it is
// a pointer (most bodies are): the memo is held globally, and a Body that
// refers back to its request would otherwise keep the request, and so its
// entry, for ever. net/http's body of an incoming request sent chunked
// does (for its trailers): a gateway forwarding the incoming request
// itself kept every such request and its buffered bytes. Any other Body
// (a comparable struct value) is kept and compared with ==.
type bodyID struct {
	typ reflect.Type       // a pointer Body's type, nil otherwise
	ptr weak.Pointer[byte] // where it points
	val io.ReadCloser      // any other Body
}

// bodyIdentity returns the identity of body.
func bodyIdentity(body io.ReadCloser) bodyID {
	if v := reflect.ValueOf(body); v.Kind() == reflect.Pointer && !v.IsNil() {
		return bodyID{typ: v.Type(), ptr: weak.Make((*byte)(v.UnsafePointer()))}
	}
	return bodyID{val: body}
}

// is reports whether body is the Body id identifies.
func (id bodyID) is(body io.ReadCloser) bool {
	if id.typ == nil {
		return sameBody(id.val, body)
	}
	v := reflect.ValueOf(body)
	// Weak pointers made from the same pointer are equal, and only they:
	// a Body allocated where a collected one was is another.
	return v.IsValid() && v.Type() == id.typ && !v.IsNil() && weak.Make((*byte)(v.UnsafePointer())) == id.ptr
}

// sameBody reports whether a and b are the same Body value (false for
// values that cannot be compared).
func sameBody(a, b io.ReadCloser) (same bool) {
	defer func() {
		if recover() != nil { // a dynamic type that is not comparable
			same = false
		}
	}()
	return a == b
}

// requestMemo maps live requests to a value; an entry goes when its
// request is garbage collected.
type requestMemo[V any] struct{ m sync.Map }

func (m *requestMemo[V]) load(req *http.Request) (V, bool) {
	v, ok := m.m.Load(weak.Make(req))
	if !ok {
		var zero V
		return zero, false
	}
	return v.(V), true
}

// keep keeps v for req, unless a value is already kept (a concurrent Do
// of the same request), and returns the value kept.
func (m *requestMemo[V]) keep(req *http.Request, v V) V {
	wp := weak.Make(req)
	if prev, loaded := m.m.LoadOrStore(wp, v); loaded {
		return prev.(V)
	}
	m.cleanup(req, wp)
	return v
}

// set keeps v for req, replacing any value kept.
func (m *requestMemo[V]) set(req *http.Request, v V) {
	wp := weak.Make(req)
	if _, loaded := m.m.Swap(wp, v); !loaded {
		m.cleanup(req, wp)
	}
}

// cleanup deletes req's entry once req is garbage collected.
func (m *requestMemo[V]) cleanup(req *http.Request, wp weak.Pointer[http.Request]) {
	runtime.AddCleanup(req, func(wp weak.Pointer[http.Request]) { m.m.Delete(wp) }, wp)
}

// loop sends the attempts.
func (c *Client) loop(req *http.Request, key string, getBody func() (io.ReadCloser, error)) (*http.Response, error) {
	ctx := req.Context()
	start := time.Now()
	fail := func(attempts int, err error) error {
		return &Error{Method: method(req), URL: logURL(req), Key: key, Attempts: attempts, Err: err}
	}
	var (
		lastResp *http.Response
		lastErr  error
		// inProgress: the last response was a 409 request-in-progress.
		inProgress bool
	)
	hc := c.httpClient()
	for attempt := 1; ; attempt++ {
		r, err := c.attempt(req, key, getBody)
		if err != nil {
			return nil, fail(attempt-1, err)
		}
		resp, err := hc.Do(r)
		err = redactErr(err)
		if err != nil && resp != nil {
			// CheckRedirect failed (a redirect loop, a policy): the
			// response's body is already closed, and the next attempt
			// would be redirected the same way.
			return nil, fail(attempt, err)
		}
		lastResp, lastErr = resp, err
		info := Retry{Request: r, Key: key, Attempt: attempt, Err: err}
		if err != nil {
			if ctx.Err() != nil {
				if inProgress {
					// Out of time while the operation was in progress.
					err = fmt.Errorf("%w (the answer before: %w)", err, ErrInProgress)
				}
				return nil, fail(attempt, err) // err wraps the context's error
			}
			if permanent(err) {
				return nil, fail(attempt, err)
			}
		} else {
			info.StatusCode = resp.StatusCode
			var v verdict
			v, info.ProblemType = classify(resp)
			inProgress = resp.StatusCode == http.StatusConflict && info.ProblemType == problem.TypeRequestInProgress
			switch v {
			case final:
				return resp, nil
			case reused:
				p := peek(resp)
				drain(resp)
				return nil, &KeyReusedError{Key: key, StatusCode: resp.StatusCode, Problem: p}
			}
		}
		if attempt >= c.cfg.MaxAttempts {
			return c.giveUp(attempt, lastResp, lastErr, info.ProblemType, fail)
		}
		d, asked := c.delay(attempt, resp)
		if asked {
			// The server's wait: honoured in full or not at all.
			if limit := c.tooLong(ctx, start, d); limit != "" {
				drain(resp)
				return nil, fail(attempt, &RetryAfterError{
					StatusCode: resp.StatusCode, ProblemType: info.ProblemType,
					RetryAfter: d, At: time.Now().Add(d), Limit: limit,
				})
			}
			d += c.retryAfterJitter(ctx, start, d)
		} else if !c.fits(ctx, start, d) {
			return c.giveUp(attempt, lastResp, lastErr, info.ProblemType, fail)
		}
		info.Delay = d
		if c.cfg.OnRetry != nil {
			c.cfg.OnRetry(info)
		}
		if c.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
			c.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "idemclient: retrying",
				slog.String("method", method(req)), slog.String("url", logURL(req)),
				slog.Int("attempt", attempt), slog.Int("status", info.StatusCode),
				slog.String("problem", info.ProblemType), slog.Any("err", logErr(err)), slog.Duration("wait", d))
		}
		drain(resp)
		if err := c.cfg.Sleep(ctx, d); err != nil {
			return nil, fail(attempt, fmt.Errorf("%w (last attempt: %w)", err, outcomeError(resp, lastErr, inProgress)))
		}
		if ctx.Err() != nil {
			return nil, fail(attempt, fmt.Errorf("%w (last attempt: %w)", ctx.Err(), outcomeError(resp, lastErr, inProgress)))
		}
	}
}

// giveUp ends the loop with the last outcome: the last response (of
// problem type ptype), except a 409 request-in-progress, which would read
// as a conflict: that is an *Error wrapping ErrInProgress.
func (c *Client) giveUp(attempts int, resp *http.Response, err error, ptype string, fail func(int, error) error) (*http.Response, error) {
	if resp != nil && resp.StatusCode == http.StatusConflict && ptype == problem.TypeRequestInProgress {
		drain(resp)
		return nil, fail(attempts, ErrInProgress)
	}
	if resp != nil {
		return resp, nil
	}
	return nil, fail(attempts, err)
}

// attempt builds the request of one attempt.
func (c *Client) attempt(req *http.Request, key string, getBody func() (io.ReadCloser, error)) (*http.Request, error) {
	r := req.Clone(req.Context())
	if r.Header == nil { // a hand-built request: http.Client accepts it
		r.Header = http.Header{}
	}
	if key != "" {
		setKey(r.Header, key)
	}
	if getBody != nil {
		b, err := getBody()
		if err != nil {
			return nil, fmt.Errorf("idemclient: request body for a retry: %w", err)
		}
		r.Body = b
		r.GetBody = func() (io.ReadCloser, error) {
			// Redirects within one attempt (307, 308) resend the body too.
			return getBody()
		}
	}
	return r, nil
}

// delay is the wait before retry n after resp (nil after a transport error),
// and whether the server asked for it (a positive Retry-After, not capped
// at MaxDelay). A Retry-After of zero or in the past gives no wait to
// honour: the normal backoff applies, so a loaded server is not retried
// back to back.
func (c *Client) delay(n int, resp *http.Response) (time.Duration, bool) {
	if ra, ok := retryAfter(resp, time.Now()); ok && ra > 0 {
		return ra, true
	}
	var d time.Duration
	if c.cfg.Backoff != nil {
		d = c.cfg.Backoff(n)
	} else {
		d = jitter(c.cfg.BaseDelay, c.cfg.MaxDelay, n)
	}
	return min(max(d, 0), c.cfg.MaxDelay), false
}

// tooLong says what a Retry-After of d goes past (MaxRetryAfter, the
// context's deadline, MaxElapsed), or "" when Do may wait for it.
func (c *Client) tooLong(ctx context.Context, start time.Time, d time.Duration) string {
	if d > c.cfg.MaxRetryAfter {
		return fmt.Sprintf("MaxRetryAfter %s", c.cfg.MaxRetryAfter)
	}
	now := time.Now()
	end := now.Add(d)
	if dl, ok := ctx.Deadline(); ok && !end.Before(dl) {
		return fmt.Sprintf("the context's deadline (in %s)", max(dl.Sub(now), 0).Round(time.Millisecond))
	}
	if c.cfg.MaxElapsed > 0 && end.Sub(start) > c.cfg.MaxElapsed {
		return fmt.Sprintf("MaxElapsed %s (%s left)", c.cfg.MaxElapsed, max(c.cfg.MaxElapsed-now.Sub(start), 0).Round(time.Millisecond))
	}
	return ""
}

// retryAfterJitter is the random extra wait added to a Retry-After of ra
// that Do may wait for (tooLong accepted it): uniform in [0, min(ra/10,
// RetryAfterJitter)], so that the clients a server told to come back at
// the same instant do not, cut to what still fits in MaxRetryAfter, the
// context's deadline and MaxElapsed, so that it never makes Do give up.
func (c *Client) retryAfterJitter(ctx context.Context, start time.Time, ra time.Duration) time.Duration {
	j := min(ra/10, c.cfg.RetryAfterJitter, c.cfg.MaxRetryAfter-ra) // NoRetryAfterJitter: negative
	now := time.Now()
	if dl, ok := ctx.Deadline(); ok {
		j = min(j, dl.Sub(now)-ra-1) // the wait must end before the deadline
	}
	if c.cfg.MaxElapsed > 0 {
		j = min(j, c.cfg.MaxElapsed-now.Sub(start)-ra)
	}
	if j <= 0 {
		return 0
	}
	return time.Duration(c.int64N(int64(j) + 1)) // ra is at most 2^32 s: no overflow
}

// fits reports whether a wait of d ends before the context's deadline and
// the MaxElapsed budget.
func (c *Client) fits(ctx context.Context, start time.Time, d time.Duration) bool {
	end := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && !end.Before(dl) {
		return false
	}
	if c.cfg.MaxElapsed > 0 && end.Sub(start) > c.cfg.MaxElapsed {
		return false
	}
	return true
}

// jitter is full-jitter exponential backoff: uniform in
// [0, min(maxDelay, base*2^(n-1))].
func jitter(base, maxDelay time.Duration, n int) time.Duration {
	ceil := base
	for i := 1; i < n && ceil < maxDelay; i++ {
		if ceil > maxDelay/2 { // doubling would pass maxDelay (or overflow)
			ceil = maxDelay
			break
		}
		ceil *= 2
	}
	ceil = min(ceil, maxDelay)
	if ceil <= 0 {
		return 0
	}
	if ceil == math.MaxInt64 {
		return time.Duration(rand.Int64N(int64(ceil)))
	}
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// retryAfter parses the Retry-After of resp: delta-seconds or an HTTP-date.
// An HTTP-date is on the server's clock: the wait is counted from the
// response's Date when it has one, so that a server whose clock is off
// still gets the wait it asked for.
func retryAfter(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil {
		return 0, false
	}
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" { // delta-seconds
		const maxSeconds = 1 << 32 // no overflow; past any MaxRetryAfter anyway
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil { // only a value out of range gets here
			s = maxSeconds
		}
		return time.Duration(min(s, maxSeconds)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		if date, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
			now = date
		}
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

type verdict int

const (
	final verdict = iota
	retry
	reused
)

// classify decides what a response means for the operation, and returns its
// problem type if it was read.
func classify(resp *http.Response) (verdict, string) {
	switch resp.StatusCode {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return retry, peekProblem(resp).typ
	case http.StatusInternalServerError:
		info := peekProblem(resp)
		switch t := info.typ; {
		case info.unknown:
			// A problem document whose type could not be read may be
			// transaction-ended: retrying could execute the command twice.
			return final, t
		case t == problem.TypeResponseTooLarge && info.notStored:
			// The handler's own failure, too large to pass on: nothing
			// was stored and the key is free.
			return retry, t
		case t == problem.TypeResponseTooLarge:
			return final, t // deterministic until the operator raises the limit
		case t == problem.TypeTransactionEnded:
			// The handler's effect may have been applied and no outcome
			// was stored: a retry executes the command again.
			return final, t
		default:
			return retry, t
		}
	case http.StatusConflict, http.StatusUnprocessableEntity:
		t := peekProblem(resp).typ
		switch {
		case t == problem.TypeKeyReused:
			return reused, t
		case t == problem.TypeRequestInProgress && resp.StatusCode == http.StatusConflict:
			return retry, t
		}
		return final, t
	}
	return final, ""
}

// problemInfo is what classify needs of a response's problem document.
type problemInfo struct {
	// typ is the document's type member, "" when it has none (or the
	// response is not problem+json).
	typ string
	// unknown is true when the response is problem+json but its type could
	// not be read: the body failed or was cut off before the type member
	// (or past peekLimit), or is not a JSON object, or has a member twice.
	unknown bool
	// notStored is true when the document has "stored": false (idemhttp's
	// failure too large to pass on).
	notStored bool
}

// peekProblem reads the type (and "stored" member) of a problem+json
// response, leaving its body readable from the start. It reads the
// top-level members one by one, so a type member that comes early is read
// even when a later member is cut off at peekLimit. A document with a
// member twice (among those read) is one whose type cannot be read, as
// problem.Problem refuses it.
func peekProblem(resp *http.Response) problemInfo {
	b, ok, err := peekBody(resp)
	if !ok {
		return problemInfo{}
	}
	if err == nil && len(bytes.TrimSpace(b)) == 0 {
		return problemInfo{} // no document at all: it claims nothing
	}
	info := problemInfo{unknown: true}
	d := json.NewDecoder(bytes.NewReader(b))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return info
	}
	seen := map[string]bool{}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return info
		}
		name, _ := t.(string)
		if seen[name] {
			// A member twice: problem.Problem refuses the document
			// (which occurrence counts is the reader's guess), so its
			// type cannot be read either.
			return problemInfo{unknown: true}
		}
		seen[name] = true
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return info
		}
		switch name {
		case "type":
			info.unknown = false
			_ = json.Unmarshal(v, &info.typ) // not a string: ignored (RFC 9457)
		case "stored":
			info.notStored = string(v) == "false"
		}
	}
	if _, err := d.Token(); err == nil {
		info.unknown = false // the whole object was read: no type member is none
	}
	return info
}

// peek decodes the problem details of resp, if it has them, and restores the
// body so that it still reads from the start.
func peek(resp *http.Response) problem.Problem {
	b, ok, _ := peekBody(resp)
	if !ok {
		return problem.Problem{}
	}
	var p problem.Problem
	if json.Unmarshal(b, &p) != nil {
		return problem.Problem{}
	}
	return p
}

// peekBody reads up to peekLimit bytes of a problem+json response's
// document, and the error that stopped it, and restores the body so that
// it still reads from the start, as sent (the error included). ok is false
// for another media type or no body.
//
// A body with Content-Encoding gzip is decompressed: net/http leaves it
// compressed when the request carried its own Accept-Encoding, or the
// transport has DisableCompression, or the server compressed unasked.
// peekLimit then bounds both the compressed bytes read and the document
// they decompress to: neither a gzip bomb nor a stream that decompresses
// to nothing makes Do read or hold more. A body in another encoding is not
// read: its document cannot be.
func peekBody(resp *http.Response) (b []byte, ok bool, err error) {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != problem.MediaType || resp.Body == nil {
		return nil, false, nil
	}
	switch enc := contentEncoding(resp.Header); enc {
	case "":
		b, err = io.ReadAll(io.LimitReader(resp.Body, peekLimit))
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(b), errReader{err}, resp.Body), resp.Body}
		return b, true, err
	case "gzip":
		raw := &recordingReader{r: io.LimitReader(resp.Body, peekLimit)}
		zr, err := gzip.NewReader(raw)
		switch {
		case err == nil:
			b, err = io.ReadAll(io.LimitReader(zr, peekLimit))
			if err == nil && len(b) < peekLimit && raw.buf.Len() == peekLimit {
				// Cut off at a member's end: the rest is unread.
				err = errGzipCut
			}
		case err == io.EOF && raw.buf.Len() == 0: //nolint:errorlint // gzip.NewReader returns io.EOF itself
			err = nil // no body at all: no document, as uncompressed
		}
		resp.Body = readCloser{io.MultiReader(&raw.buf, errReader{raw.err}, resp.Body), resp.Body}
		return b, true, err
	default:
		return nil, true, fmt.Errorf("idemclient: Content-Encoding %q not decoded", enc)
	}
}

// errGzipCut stops the peek of a gzip body whose first peekLimit bytes
// decompress to less than peekLimit and end at a member's end.
var errGzipCut = errors.New("idemclient: gzip body cut off at the peek limit")

// contentEncoding is the coding of h's body: "" for none (or identity),
// "gzip" (or x-gzip), or the Content-Encoding as sent for anything else.
func contentEncoding(h http.Header) string {
	var codings []string
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	switch {
	case len(codings) == 0:
		return ""
	case len(codings) == 1 && (codings[0] == "gzip" || codings[0] == "x-gzip"):
		return "gzip"
	}
	return strings.Join(h.Values("Content-Encoding"), ", ")
}

// recordingReader keeps what it reads of r, and the first error other than
// io.EOF, to give them back to the body's reader.
type recordingReader struct {
	r   io.Reader
	buf bytes.Buffer
	err error
}

func (rr *recordingReader) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	rr.buf.Write(p[:n])
	if err != nil && err != io.EOF && rr.err == nil { //nolint:errorlint // io.EOF is returned unwrapped
		rr.err = err
	}
	return n, err
}

type readCloser struct {
	io.Reader
	io.Closer
}

// errReader replays a read error met while peeking; nil reads as EOF so the
// MultiReader moves on to the rest of the body.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}

// permanent reports transport errors that no retry can fix.
func permanent(err error) bool {
	var (
		cve *tls.CertificateVerificationError
		uae x509.UnknownAuthorityError
		he  x509.HostnameError
		cie x509.CertificateInvalidError
		rhe tls.RecordHeaderError
	)
	if errors.As(err, &cve) || errors.As(err, &uae) || errors.As(err, &he) ||
		errors.As(err, &cie) || errors.As(err, &rhe) {
		return true
	}
	if errors.Is(err, http.ErrSchemeMismatch) { // plain HTTP behind an https:// URL
		return true
	}
	// The request itself cannot be sent (net/http refuses it before
	// dialling; its errors have no type of their own).
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		msg := ue.Err.Error()
		for _, prefix := range unsendable {
			if strings.HasPrefix(msg, prefix) {
				return true
			}
		}
	}
	return false
}

// unsendable start the messages of the errors net/http returns for a
// request it refuses before dialling.
var unsendable = []string{
	"unsupported protocol scheme",
	"http: no Host in request URL",
	"http: nil Request.URL",
	"http: Request.RequestURI can't be set in client requests",
	"net/http: invalid header ", // field name or value
	"net/http: invalid trailer ",
	"net/http: invalid method ",
	"http: ContentLength=", // "... with Body length N": GetBody's body is not that long
}

// outcomeError describes the last outcome for an error message;
// inProgress: resp was a 409 request-in-progress.
func outcomeError(resp *http.Response, err error, inProgress bool) error {
	if err != nil {
		return err
	}
	if resp != nil && inProgress {
		return fmt.Errorf("response %s: %w", resp.Status, ErrInProgress)
	}
	if resp != nil {
		return fmt.Errorf("response %s", resp.Status)
	}
	return errors.New("none")
}

// drain reads a little of resp's body so the connection can be reused, and
// closes it.
func drain(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
	_ = resp.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// logURL is the request URL without user info, query and fragment, for logs.
func logURL(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	u := *req.URL
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

// redactErr returns err, a *url.Error from http.Client.Do, as a copy naming
// its URL without user info, query and fragment, like the logs (the
// original may be shared: it is not modified).
func redactErr(err error) error {
	ue, ok := err.(*url.Error) //nolint:errorlint // http.Client.Do returns one unwrapped; it is replaced
	if !ok {
		return err
	}
	c := *ue
	c.URL = stripURL(ue.URL)
	return &c
}

// stripURL is the URL s without user info, query and fragment.
func stripURL(s string) string {
	u, err := url.Parse(s)
	if err != nil { // net/http names a URL it parsed, without its password
		s, _, _ = strings.Cut(s, "?")
		s, _, _ = strings.Cut(s, "#")
		return s
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

// logErr is err without the URL a transport error (*url.Error) names: its
// query may hold secrets, and the log line names the URL without it.
func logErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
