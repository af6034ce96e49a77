package idemhttp_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

// TestCancelledRequestIsAnswered: a request whose context is cancelled
// while the client is still connected (a server whose BaseContext ends
// at SIGTERM, the usual signal.NotifyContext pattern; a client that
// half-closes its side after the request) must get an answer that says
// retry: 503 with Retry-After, never net/http's empty 200 OK, which a
// client takes for success although the command was rolled back (the key's
// holder in ModeTx) or never ran (a duplicate waiting for the key).
func TestCancelledRequestIsAnswered(t *testing.T) {
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			forEach(t, func(t *testing.T, e *env) {
				var calls atomic.Int64
				inside := make(chan struct{}, 1)
				effect := effectHandler(t, e, http.StatusCreated, &calls)
				h := e.wrap(t, &idemhttp.Config{Mode: mode, Wait: 5 * time.Second},
					http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						// The effect (in ModeTx in the middleware's
						// transaction), then a pause during which the
						// server stops.
						rec := httptest.NewRecorder()
						effect.ServeHTTP(rec, r)
						inside <- struct{}{}
						<-r.Context().Done()
						w.Header().Set("Content-Type", "application/json")
						w.WriteHeader(rec.Code)
						_, _ = w.Write(rec.Body.Bytes())
					}))
				base, stop := context.WithCancel(context.Background())
				defer stop()
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				srv := &http.Server{Handler: h, BaseContext: func(net.Listener) context.Context { return base }}
				go func() { _ = srv.Serve(ln) }()
				defer srv.Close()

				type answer struct {
					status          int
					ctype, ra, repl string
					body            string
					err             error
				}
				post := func(out chan<- answer) {
					req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/pay?label=cancel", strings.NewReader(`{}`))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", "cancel")
					res, err := http.DefaultClient.Do(req)
					if err != nil {
						out <- answer{err: err}
						return
					}
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					out <- answer{res.StatusCode, res.Header.Get("Content-Type"), res.Header.Get("Retry-After"),
						res.Header.Get(idemhttp.ReplayedHeader), string(b), nil}
				}
				holder, dup := make(chan answer, 1), make(chan answer, 1)
				go post(holder)
				<-inside
				go post(dup)
				time.Sleep(300 * time.Millisecond) // the duplicate waits for the key
				stop()
				for name, ch := range map[string]chan answer{"holder": holder, "duplicate": dup} {
					a := <-ch
					switch {
					case a.err != nil:
						t.Errorf("%s: %v", name, a.err)
					case a.status == http.StatusCreated:
						// The handler's own answer (ModeLease stores it), or its replay.
					case a.status == http.StatusServiceUnavailable || a.status == http.StatusConflict:
						if a.ctype != problem.MediaType || a.ra == "" {
							t.Errorf("%s: %d %q Retry-After %q %s, want a problem with Retry-After", name, a.status, a.ctype, a.ra, a.body)
						}
					default:
						t.Errorf("%s: %d %q %q, want 503 (or 409) with Retry-After: the command was not executed", name, a.status, a.ctype, a.body)
					}
				}
				if mode == idemhttp.ModeTx {
					if n := e.effects(t, "cancel"); n != 0 {
						t.Fatalf("effects = %d, want 0 (rolled back)", n)
					}
				}
			})
		})
	}
}
