package idemhttp_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

// TestScopeReadingTheBody: a Scope hook that must read the body (an HMAC
// signature authenticator) cannot take it from the fingerprint or the
// handler, whatever it leaves in r.Body: the handler sees the client's whole
// body, and the key reused with another body is a mismatch, not a replay of
// the first response.
func TestScopeReadingTheBody(t *testing.T) {
	t.Parallel()
	hooks := []struct {
		name string
		read func(r *http.Request) error
	}{
		{"reads-all-restores-nothing", func(r *http.Request) error {
			_, err := io.ReadAll(r.Body)
			return err
		}},
		{"reads-all-restores", func(r *http.Request) error {
			b, err := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			return err
		}},
		{"reads-part", func(r *http.Request) error {
			_, err := io.ReadFull(r.Body, make([]byte, 7))
			return err
		}},
		{"closes", func(r *http.Request) error {
			_, err := io.ReadAll(r.Body)
			return errors.Join(err, r.Body.Close())
		}},
		{"replaces", func(r *http.Request) error {
			_, err := io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(`{"amount":"0.01"}`))
			return err
		}},
	}
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		for _, hook := range hooks {
			t.Run(mode.String()+"/"+hook.name, func(t *testing.T) {
				t.Parallel()
				forEach(t, func(t *testing.T, e *env) {
					var calls atomic.Int64
					var seen atomic.Value
					effect := effectHandler(t, e, 201, &calls)
					h := e.wrap(t, &idemhttp.Config{Mode: mode, Scope: func(r *http.Request) (string, error) {
						if err := hook.read(r); err != nil {
							return "", err
						}
						return "signer-1", nil
					}}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						b, err := io.ReadAll(r.Body)
						if err != nil {
							t.Errorf("handler: reading the body: %v", err)
						}
						seen.Store(string(b))
						effect.ServeHTTP(w, r)
					}))
					const pay = `{"amount":"10.00","to":"bob"}`
					first := send(h, "POST", "/pay?label=a", "k-1", pay)
					if first.Code != 201 {
						t.Fatalf("first: %d %s", first.Code, first.Body)
					}
					if got := seen.Load(); got != pay {
						t.Fatalf("the handler read body %q, want the client's %q", got, pay)
					}
					// The same key with another body: the fingerprint covered
					// the first body, not what the hook left of it.
					other := send(h, "POST", "/pay?label=a", "k-1", `{"amount":"99999.00","to":"eve"}`)
					checkProblem(t, other, http.StatusConflict, problem.TypeKeyReused)
					// The retry with the same body is the stored response.
					retry := send(h, "POST", "/pay?label=a", "k-1", pay)
					if retry.Code != 201 || retry.Header().Get(idemhttp.ReplayedHeader) != "true" || retry.Body.String() != first.Body.String() {
						t.Fatalf("retry: %d replayed=%q %s, want the stored %s", retry.Code,
							retry.Header().Get(idemhttp.ReplayedHeader), retry.Body, first.Body)
					}
					if n := calls.Load(); n != 1 {
						t.Fatalf("handler ran %d times, want 1", n)
					}
				})
			})
		}
	}
}

// brokenBody is a body whose connection broke after a few bytes; its
// error names addresses, which the client must not be sent.
type brokenBody struct{ io.Reader }

const errBroken = constErr("read tcp 10.0.0.1:443->203.0.113.7:50312: connection reset by peer")

func (b brokenBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err == io.EOF {
		err = errBroken
	}
	return n, err
}

// TestScopeAndBadBody pins which answer a request gets when both its Scope
// hook and its body fail. A hook that does not read the body answers first,
// as before the middleware read the body ahead of it (401); a hook that read
// a body that could not be read whole got an error from it, so the body's
// answer is sent (413, or 400 without the read error's addresses), not a
// 401 carrying that error as detail, and never a 2xx over part of it.
func TestScopeAndBadBody(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		next := effectHandler(t, e, 201, &calls)
		headerScope := e.wrap(t, &idemhttp.Config{MaxBodyBytes: 16, Scope: func(r *http.Request) (string, error) {
			if p := r.Header.Get("X-Principal"); p != "none" {
				return p, nil
			}
			return "", errUnauthenticated
		}}, next)
		var hookErr error // the hook runs in ServeHTTP's goroutine
		signedScope := e.wrap(t, &idemhttp.Config{MaxBodyBytes: 16, Scope: func(r *http.Request) (string, error) {
			if _, err := io.ReadAll(r.Body); err != nil {
				hookErr = err
				return "", err
			}
			return "signer-1", nil
		}}, next)
		big := strings.Repeat("x", 17)

		checkProblem(t, send(headerScope, "POST", "/pay", "k", big, "X-Principal", "none"), 401, problem.TypeUnauthenticated)
		checkProblem(t, send(headerScope, "POST", "/pay", "k", big, "X-Principal", ""), 401, problem.TypeUnauthenticated)
		checkProblem(t, send(headerScope, "POST", "/pay", "k", big, "X-Principal", "alice"), 413, problem.TypeBodyTooLarge)

		checkProblem(t, send(signedScope, "POST", "/pay", "k", big), 413, problem.TypeBodyTooLarge)
		var tooLarge *http.MaxBytesError
		if !errors.As(hookErr, &tooLarge) {
			t.Fatalf("the hook read a too-large body with error %v, want *http.MaxBytesError", hookErr)
		}

		for _, h := range []http.Handler{headerScope, signedScope} {
			req := httptest.NewRequest("POST", "/pay", brokenBody{strings.NewReader(`{"a":`)})
			req.Header.Set("Idempotency-Key", "k")
			req.Header.Set("X-Principal", "alice")
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			if strings.Contains(rr.Body.String(), "203.0.113.7") {
				t.Fatalf("the answer names the connection's addresses: %s", rr.Body)
			}
			checkProblem(t, rr, 400, problem.TypeValidation)
		}
		if n := calls.Load(); n != 0 {
			t.Fatalf("handler ran %d times for rejected requests", n)
		}
		// A body within the limit still works through both.
		if rr := send(signedScope, "POST", "/pay", "k", strings.Repeat("x", 16)); rr.Code != 201 {
			t.Fatalf("16 bytes: %d %s", rr.Code, rr.Body)
		}
	})
}

// readCounter is a request body that counts the bytes read from it.
type readCounter struct {
	io.Reader
	n *atomic.Int64
}

func (c readCounter) Read(p []byte) (int, error) {
	n, err := c.Reader.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestScopeRejectsBeforeBody: a Scope hook that answers from the headers
// alone (a bearer token) rejects a request without its body being read, as
// before the middleware let hooks read the body: an unauthenticated client
// is not sent 100 Continue, does not upload its body, and the server does
// not buffer up to MaxBodyBytes for it. A hook that reads the body still
// gets it whole, and an accepted request's body is read as usual.
func TestScopeRejectsBeforeBody(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		h := e.wrap(t, &idemhttp.Config{Scope: func(r *http.Request) (string, error) {
			if p := r.Header.Get("X-Principal"); p != "" {
				return p, nil
			}
			return "", errUnauthenticated
		}}, effectHandler(t, e, 201, &calls))
		for _, principal := range []string{"", "alice"} {
			var read atomic.Int64
			req := httptest.NewRequest("POST", "/pay", readCounter{strings.NewReader(`{"amount":"10.00"}`), &read})
			req.Header.Set("Idempotency-Key", "k-"+principal)
			req.Header.Set("Content-Type", "application/json")
			if principal != "" {
				req.Header.Set("X-Principal", principal)
			}
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			if principal == "" {
				checkProblem(t, rr, 401, problem.TypeUnauthenticated)
				if n := read.Load(); n != 0 {
					t.Fatalf("a request the Scope hook rejected from its headers had %d body bytes read, want none", n)
				}
				continue
			}
			if rr.Code != 201 || read.Load() != int64(len(`{"amount":"10.00"}`)) {
				t.Fatalf("accepted request: %d %s, %d body bytes read", rr.Code, rr.Body, read.Load())
			}
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
}
