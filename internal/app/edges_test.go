package app_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/apijson/apijsontest"
	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/internal/payments"
	"github.com/idemkit/idem/problem"
)

// endpoint is one of idemd's JSON endpoints with what the edge tests need.
type endpoint struct {
	path  string
	limit int
	valid func(n int) string // a body that creates: 201, new for each n
	// sized returns a JSON body of exactly n bytes (n well above its
	// fixed part).
	sized func(n int) string
	// direct is the endpoint's handler without the middleware in front.
	direct http.HandlerFunc
}

func endpoints() []endpoint {
	pad := func(prefix, suffix string) func(int) string {
		return func(n int) string { return prefix + strings.Repeat("a", n-len(prefix)-len(suffix)) + suffix }
	}
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	return []endpoint{
		{
			path: "/v1/payments", limit: payments.MaxRequestBytes, valid: func(n int) string { return paymentBody(fmt.Sprint("edge-", n)) },
			sized:  pad(`{"provider":"`, `"}`),
			direct: payments.NewHandler[any](nil, discard).Create,
		},
		{
			path: "/v1/orders", limit: orders.MaxRequestBytes, valid: func(n int) string { return orderBody(7, "19.90") },
			sized:  pad(`{"items":[{"sku":"`, `"}]}`),
			direct: orders.NewHandler[any](nil, nil, false, discard).Create,
		},
	}
}

// send posts body to path on e's server with exactly the headers of h (no
// Content-Type unless h has one).
func (e *env) send(path string, h http.Header, body string) response {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header = h
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("POST %s: %v", path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func headers(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// answer is what identifies a problem for a client.
type answer struct {
	status              int
	typ, title, detail  string
	contentType, stored string
}

func answerOf(t *testing.T, r response) answer {
	t.Helper()
	m := r.json(t)
	str := func(k string) string { s, _ := m[k].(string); return s }
	return answer{status: r.status, typ: str("type"), title: str("title"), detail: str("detail"),
		contentType: r.header.Get("Content-Type"), stored: r.header.Get("Idempotent-Replayed")}
}

// Every too-large body of an endpoint gets one answer, the idempotency
// middleware's 413 body-too-large, whatever its size; the endpoint's own
// check answers the same; the key is not consumed.
func TestBodyTooLargeIsOneAnswer(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		for _, ep := range endpoints() {
			t.Run(ep.path, func(t *testing.T) {
				// What the endpoint answers by itself (no middleware in front).
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, ep.path, strings.NewReader(ep.sized(ep.limit+1)))
				req.Header.Set("Content-Type", "application/json")
				ep.direct(rec, req)
				want := answerOf(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()})
				if want.status != http.StatusRequestEntityTooLarge || want.typ != problem.TypeBodyTooLarge ||
					want.contentType != problem.MediaType {
					t.Errorf("endpoint alone: %+v, want 413 %s", want, problem.TypeBodyTooLarge)
				}
				for i, n := range []int{ep.limit + 1, 1<<20 + 1, 10 << 20} {
					key := fmt.Sprintf("too-large-%d", i)
					got := answerOf(t, e.send(ep.path, headers("Content-Type", "application/json", "Idempotency-Key", key), ep.sized(n)))
					if got != want {
						t.Errorf("%d bytes: %+v, want %+v", n, got, want)
					}
					// Not stored: the corrected request with the same key executes.
					if r := e.send(ep.path, headers("Content-Type", "application/json", "Idempotency-Key", key), ep.valid(i)); r.status != http.StatusCreated {
						t.Errorf("%d bytes, then a valid body with the same key: %d %s, want 201", n, r.status, r.body)
					}
				}
				if r := e.send(ep.path, headers("Content-Type", "application/json", "Idempotency-Key", "at-limit"), ep.sized(ep.limit)); r.status == http.StatusRequestEntityTooLarge {
					t.Errorf("%d bytes (the limit): %d %s, want a validation answer", ep.limit, r.status, r.body)
				}
			})
		}
	})
}

// A POST without Content-Type is answered 415 like one with another media
// type, before the key is claimed: the corrected request with the same key
// executes.
func TestContentTypeRequired(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		for _, ep := range endpoints() {
			t.Run(ep.path, func(t *testing.T) {
				var first answer
				for i, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded"} {
					key := fmt.Sprintf("media-type-%d", i)
					h := headers("Idempotency-Key", key)
					if ct != "" {
						h.Set("Content-Type", ct)
					}
					got := answerOf(t, e.send(ep.path, h, ep.valid(10+i)))
					if i == 0 {
						first = got
					}
					if got.status != http.StatusUnsupportedMediaType || got.contentType != problem.MediaType || got.stored != "" || got != first {
						t.Errorf("Content-Type %q: %+v, want the 415 problem %+v", ct, got, first)
					}
					h.Set("Content-Type", "application/json")
					if r := e.send(ep.path, h, ep.valid(10+i)); r.status != http.StatusCreated {
						t.Errorf("Content-Type %q, then application/json with the same key: %d %s, want 201", ct, r.status, r.body)
					}
				}
				// The endpoint alone answers the same.
				rec := httptest.NewRecorder()
				ep.direct(rec, httptest.NewRequest(http.MethodPost, ep.path, strings.NewReader(ep.valid(19))))
				if got := answerOf(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}); got != first {
					t.Errorf("endpoint alone without Content-Type: %+v, want %+v", got, first)
				}
			})
		}
	})
}

// A connection broken mid-body is answered without the network error: no
// address, no "tcp" in the problem, whichever layer reads the body; the
// log has the error but never the body.
func TestBrokenBodyLeaksNothing(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		const secret = "secret-body-0042"
		for _, ep := range endpoints() {
			for _, layer := range []string{"app", "endpoint"} {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, ep.path, apijsontest.BrokenBody(strings.NewReader(`{"provider":"`+secret)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "broken-"+layer)
				if layer == "app" {
					e.app.Handler().ServeHTTP(rec, req)
				} else {
					ep.direct(rec, req)
				}
				body := rec.Body.String()
				if rec.Code != http.StatusBadRequest || rec.Header().Get("Content-Type") != problem.MediaType {
					t.Errorf("%s %s: %d %s, want a 400 problem", layer, ep.path, rec.Code, body)
				}
				for _, leak := range []string{"127.0.0.1", "tcp", "5555", "connection reset", secret} {
					if strings.Contains(strings.ToLower(body), leak) {
						t.Errorf("%s %s: the problem contains %q: %s", layer, ep.path, leak, body)
					}
				}
			}
		}
		if logs := e.logs.String(); strings.Contains(logs, secret) {
			t.Errorf("the log contains the body:\n%s", logs)
		}
		// Nothing was claimed: the keys are free.
		for _, ep := range endpoints() {
			if r := e.send(ep.path, headers("Content-Type", "application/json", "Idempotency-Key", "broken-app"), ep.valid(20)); r.status != http.StatusCreated {
				t.Errorf("%s after a broken body: %d %s, want 201", ep.path, r.status, r.body)
			}
		}
	})
}

// A body with a content coding idemd does not decode (a client library
// that gzips its requests) is answered 415 with Accept-Encoding (RFC 9110
// 15.5.16), before the key is claimed: the same request sent uncompressed
// with the same key executes. (It was read as JSON: 400 "not valid UTF-8",
// stored under the key, so the corrected request got 409 key-reused.)
func TestContentEncodingRefused(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		for _, ep := range endpoints() {
			t.Run(ep.path, func(t *testing.T) {
				var gz bytes.Buffer
				zw := gzip.NewWriter(&gz)
				_, _ = zw.Write([]byte(ep.valid(30)))
				_ = zw.Close()
				h := headers("Idempotency-Key", "gzipped", "Content-Type", "application/json", "Content-Encoding", "gzip")
				r := e.send(ep.path, h, gz.String())
				if r.status != http.StatusUnsupportedMediaType || r.header.Get("Content-Type") != problem.MediaType ||
					r.header.Get("Accept-Encoding") != "identity" {
					t.Errorf("gzipped body: %d %v %s; want a 415 problem with Accept-Encoding: identity", r.status, r.header, r.body)
				}
				h.Del("Content-Encoding")
				if r := e.send(ep.path, h, ep.valid(30)); r.status != http.StatusCreated {
					t.Errorf("the same, uncompressed, with the same key: %d %s; want 201", r.status, r.body)
				}
				h = headers("Idempotency-Key", "identity", "Content-Type", "application/json", "Content-Encoding", "identity")
				if r := e.send(ep.path, h, ep.valid(31)); r.status != http.StatusCreated {
					t.Errorf("Content-Encoding: identity: %d %s; want 201", r.status, r.body)
				}
			})
		}
	})
}

// A body declared in a charset other than UTF-8 (application/json;
// charset=iso-8859-1) is answered 415 before the key is claimed, by the
// app and by the endpoint alone: the same request declared UTF-8 (in any
// case) with the same key executes. (It was read as UTF-8: accepted, or a
// 400 stored under the key when it held a Latin-1 byte.)
func TestContentTypeCharsetRefused(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		for _, ep := range endpoints() {
			t.Run(ep.path, func(t *testing.T) {
				for i, ct := range []string{"application/json; charset=iso-8859-1", "application/json;charset=\"windows-1252\"", "application/json; charset=utf-16"} {
					key := fmt.Sprintf("charset-%d", i)
					h := headers("Idempotency-Key", key, "Content-Type", ct)
					r := e.send(ep.path, h, ep.valid(40+i))
					if r.status != http.StatusUnsupportedMediaType || r.header.Get("Content-Type") != problem.MediaType ||
						!strings.Contains(string(r.body), "UTF-8") {
						t.Errorf("Content-Type %q: %d %s; want a 415 problem asking for UTF-8", ct, r.status, r.body)
					}
					rec := httptest.NewRecorder()
					req := httptest.NewRequest(http.MethodPost, ep.path, strings.NewReader(ep.valid(40+i)))
					req.Header.Set("Content-Type", ct)
					ep.direct(rec, req)
					if rec.Code != http.StatusUnsupportedMediaType || rec.Header().Get("Content-Type") != problem.MediaType {
						t.Errorf("endpoint alone, Content-Type %q: %d %s; want a 415 problem", ct, rec.Code, rec.Body)
					}
					h.Set("Content-Type", "application/json; charset=UTF-8")
					if r := e.send(ep.path, h, ep.valid(40+i)); r.status != http.StatusCreated {
						t.Errorf("Content-Type %q, then charset=UTF-8 with the same key: %d %s; want 201", ct, r.status, r.body)
					}
				}
			})
		}
	})
}
