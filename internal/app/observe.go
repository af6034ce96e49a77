package app

import (
	"errors"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

// statusWriter remembers the status and size of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 && status >= 200 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// observe writes one access log line (with the request's Idempotency-Key,
// if any) and updates the request metrics for every request, and turns a
// handler panic into a logged 500 problem (or, once the response started,
// a cut connection).
func (a *App) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			p := recover()
			if err, ok := p.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(p)
			}
			// A panic after the response started: the client must not
			// take what it got for the whole response; the connection
			// is cut, once the request is logged and counted.
			cut := p != nil && sw.status != 0
			if p != nil {
				// With the stack (the panicking frames are still on it,
				// re-panicked by the middleware or not): the line is what
				// an operator reports, and net/http's own, which this
				// recover replaces, had it.
				a.log.ErrorContext(r.Context(), "handler panic", "method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
				if sw.status == 0 {
					problem.WriteError(sw, http.StatusInternalServerError, "", "Internal error", "")
				}
			}
			if cut {
				defer panic(http.ErrAbortHandler)
			}
			status := sw.status
			switch {
			case cut:
				// Whatever status went out, the client gets no
				// complete response: a server error, counted and
				// logged as one (the 5xx ratio alert covers panics).
				status = http.StatusInternalServerError
			case status == 0:
				status = http.StatusOK
			}
			route := r.Pattern // set by the ServeMux on this request
			if route == "" {
				route = "unmatched"
			}
			elapsed := time.Since(start)
			a.metrics.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
			a.metrics.duration.WithLabelValues(route).Observe(elapsed.Seconds())
			attrs := []slog.Attr{
				slog.String("method", r.Method),
				slog.String("path", r.URL.Path),
				slog.String("route", route),
				slog.Int("status", status),
				slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
				slog.Bool("replayed", sw.Header().Get(idemhttp.ReplayedHeader) == "true"),
				slog.Int("bytes", sw.bytes),
			}
			if cut {
				attrs = append(attrs, slog.Bool("cut", true))
			}
			if key := r.Header.Get(idemhttp.KeyHeader); key != "" {
				// What the request is looked up by (its idempotency
				// record, the middleware's own lines); a key too long
				// to be valid is cut.
				if len(key) > idemhttp.MaxKeyLen {
					key = key[:idemhttp.MaxKeyLen]
				}
				attrs = append(attrs, slog.String("idempotency_key", key))
			}
			a.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
		}()
		next.ServeHTTP(sw, r)
	})
}
