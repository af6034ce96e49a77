package idemclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Defaults of Config.
const (
	DefaultMaxAttempts = 5
	DefaultBaseDelay   = 100 * time.Millisecond
	DefaultMaxDelay    = 10 * time.Second
	// DefaultMaxRetryAfter is the longest Retry-After Do waits for by
	// default (or MaxDelay, when that is longer).
	DefaultMaxRetryAfter = time.Minute
	// DefaultRetryAfterJitter is the default bound of the random extra
	// wait Do adds to a Retry-After (which is also at most a tenth of it).
	DefaultRetryAfterJitter = 5 * time.Second
	DefaultMaxBodyBytes     = 1 << 20
	// DefaultTimeout is the per-attempt timeout of the default HTTP client.
	DefaultTimeout = 30 * time.Second
)

// NoRetryAfterJitter as Config.RetryAfterJitter makes Do wait exactly the
// Retry-After a server asked for, adding nothing.
const NoRetryAfterJitter time.Duration = -1

// Config configures a Client. The zero value (or a nil *Config) gives the
// defaults.
type Config struct {
	// HTTPClient sends each attempt. Defaults to an http.Client on
	// http.DefaultTransport with a Timeout of DefaultTimeout (30s), which
	// bounds each attempt separately (including reading the body of the
	// response Do returns). An attempt that times out may have executed on
	// the server; it is retried with the same key. Size the timeout above
	// the server's slowest answer: idemhttp's ModeTx rolls back a command
	// whose client went away before its COMMIT, so a command slower than
	// the timeout times out at every attempt and never completes. A client
	// of yours without a Timeout leaves each attempt bounded only by the
	// request's context (without a deadline, a server that never answers
	// holds Do for ever). Do sends with a copy of it whose CheckRedirect
	// first refuses to follow a 301 or 302 that would turn a command into
	// a GET (see Redirects in the package documentation), then calls this
	// client's CheckRedirect.
	HTTPClient *http.Client

	// MaxAttempts is the maximum number of attempts per Do, the first one
	// included; 1 disables retries. Defaults to DefaultMaxAttempts (5).
	MaxAttempts int

	// BaseDelay is the backoff before the first retry, doubled for each
	// further one before jitter. Defaults to DefaultBaseDelay (100ms).
	BaseDelay time.Duration

	// MaxDelay caps the client's own backoff (the waits without a
	// positive Retry-After). Defaults to DefaultMaxDelay (10s); it may not
	// be below BaseDelay. It does not shorten a server's Retry-After: see
	// MaxRetryAfter.
	MaxDelay time.Duration

	// MaxRetryAfter is the longest Retry-After Do waits for. Do never
	// retries sooner than the server asked (that only adds load to a
	// server that said it cannot serve until then): a retryable response
	// whose Retry-After is longer than MaxRetryAfter, or would end after
	// the request context's deadline or MaxElapsed, ends Do at once with an
	// *Error whose cause is a *RetryAfterError. Defaults to
	// DefaultMaxRetryAfter (1m), or MaxDelay when that is longer.
	MaxRetryAfter time.Duration

	// RetryAfterJitter bounds the random extra wait Do adds to a server's
	// Retry-After, so that the clients a server answered 429 or 503 with
	// the same Retry-After do not all come back at the same instant (a
	// thundering herd that overloads it again): Do waits the Retry-After
	// plus a uniform random extra in [0, min(Retry-After/10,
	// RetryAfterJitter)], never less than the server asked. The extra is
	// cut to what fits in MaxRetryAfter, the context's deadline and
	// MaxElapsed: it never makes Do give up on a wait it could make.
	// Defaults to DefaultRetryAfterJitter (5s); NoRetryAfterJitter
	// disables it.
	RetryAfterJitter time.Duration

	// MaxElapsed, when positive, is the time budget of one Do, counted from
	// its start: no wait may end after it, so Do gives up rather than sleep
	// past it. It does not interrupt an attempt in flight (the request's
	// context and HTTPClient.Timeout do that). Zero means no budget beyond
	// MaxAttempts and the context.
	MaxElapsed time.Duration

	// Methods are the methods whose requests need an Idempotency-Key: Do
	// generates one when such a request has none (and the same one when
	// the request is passed to Do again). nil means POST and PATCH; an
	// empty non-nil slice means never generate a key.
	Methods []string

	// NewKey generates a key for a request that needs one. Defaults to
	// NewKey (a UUIDv7). It must return 1 to 255 visible ASCII characters
	// other than the double quote.
	NewKey func() (string, error)

	// MaxBodyBytes is the largest request body Do buffers to resend it when
	// the request has no GetBody. Defaults to DefaultMaxBodyBytes (1 MiB).
	MaxBodyBytes int64

	// Backoff, if set, replaces the default full-jitter backoff: it returns
	// the wait before retry n (1 for the second attempt) when the response
	// has no positive Retry-After (none, zero, or an HTTP-date already
	// past), or after a transport error. The result is capped at MaxDelay.
	Backoff func(n int) time.Duration

	// Sleep, if set, replaces the wait between attempts (a test hook, or a
	// clock of your own). It must return ctx.Err() promptly when ctx ends.
	// It is called for every retry, with d >= 0.
	Sleep func(ctx context.Context, d time.Duration) error

	// OnRetry, if set, is called before each wait, for logs and metrics. It
	// runs on the goroutine calling Do and must not block.
	OnRetry func(Retry)

	// Logger receives one debug line per retry (method, URL without its
	// query and user info, attempt, status or error, wait), never a key,
	// a header or a body. Defaults to slog.Default(); its level decides
	// whether anything is written.
	Logger *slog.Logger
}

// Retry describes a failed attempt that Do is about to retry.
type Retry struct {
	// Request is the attempt that failed; its body has been consumed.
	Request *http.Request
	// Key is the Idempotency-Key every attempt carries ("" for an idempotent
	// method sent without one).
	Key string
	// Attempt is the number of the attempt that failed, from 1.
	Attempt int
	// StatusCode is the status of its response, 0 after a transport error.
	StatusCode int
	// ProblemType is the problem type URI of its response, if it had one.
	ProblemType string
	// Err is the transport error, nil when a response came back.
	Err error
	// Delay is the wait before the next attempt (after a Retry-After: that
	// wait plus its jitter, see Config.RetryAfterJitter).
	Delay time.Duration
}

func (c Config) withDefaults() Config {
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: DefaultTimeout}
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BaseDelay == 0 {
		c.BaseDelay = DefaultBaseDelay
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = max(DefaultMaxDelay, c.BaseDelay)
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = max(DefaultMaxRetryAfter, c.MaxDelay)
	}
	if c.RetryAfterJitter == 0 {
		c.RetryAfterJitter = DefaultRetryAfterJitter
	}
	if c.Methods == nil {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	} else {
		c.Methods = append([]string(nil), c.Methods...)
	}
	if c.NewKey == nil {
		c.NewKey = NewKey
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("MaxAttempts %d: must be at least 1", c.MaxAttempts))
	}
	if c.BaseDelay < 0 {
		errs = append(errs, fmt.Errorf("BaseDelay %s: must not be negative", c.BaseDelay))
	}
	if c.MaxDelay < 0 {
		errs = append(errs, fmt.Errorf("MaxDelay %s: must not be negative", c.MaxDelay))
	} else if c.MaxDelay < c.BaseDelay {
		errs = append(errs, fmt.Errorf("MaxDelay %s: must not be below BaseDelay %s", c.MaxDelay, c.BaseDelay))
	}
	if c.MaxRetryAfter < 0 {
		errs = append(errs, fmt.Errorf("MaxRetryAfter %s: must not be negative", c.MaxRetryAfter))
	}
	if c.RetryAfterJitter < 0 && c.RetryAfterJitter != NoRetryAfterJitter {
		errs = append(errs, fmt.Errorf("RetryAfterJitter %s: must be positive or NoRetryAfterJitter", c.RetryAfterJitter))
	}
	if c.MaxElapsed < 0 {
		errs = append(errs, fmt.Errorf("MaxElapsed %s: must not be negative", c.MaxElapsed))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBodyBytes %d: must not be negative", c.MaxBodyBytes))
	}
	for _, m := range c.Methods {
		if !isToken(m) {
			errs = append(errs, fmt.Errorf("method %q in Methods is not an HTTP method token", m))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemclient: invalid config: %w", err)
	}
	return nil
}

// isToken reports whether s is an RFC 9110 token, the syntax of a method.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
