package app

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/observe"
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
// a cut connection). With a Tracer, each request is one server span
// (startServerSpan), in whose context the request is served and its
// access and panic lines are logged.
func (a *App) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		var (
			span    observe.Span // nil: untraced
			rt      *router      // set when traced: routed once, for the span's name
			pattern string
		)
		if a.tracer != nil {
			if rt, _ = next.(*router); rt != nil {
				pattern = rt.pattern(r)
			}
			r, span = a.startServerSpan(r, pattern)
		}
		defer func() {
			p := recover()
			if err, ok := p.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				if span != nil {
					endServerSpan(span, r.Pattern, sw.status, p)
				}
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
			if span != nil {
				endServerSpan(span, r.Pattern, status, p)
			}
		}()
		if rt != nil {
			rt.serve(sw, r, pattern)
			return
		}
		next.ServeHTTP(sw, r)
	})
}

// startServerSpan returns r in the context of its server span: a child of
// the caller's span when r has a W3C traceparent (and a Propagator is
// set), the root of a trace otherwise. Its name is the ServeMux pattern r
// matches ("POST /v1/orders"), its method alone for a request no route
// matches ("HTTP" for a method outside RFC 9110's), as OpenTelemetry's
// HTTP conventions name them.
func (a *App) startServerSpan(r *http.Request, pattern string) (*http.Request, observe.Span) {
	ctx := r.Context()
	if a.propagator != nil && r.Header.Get(observe.TraceParent) != "" {
		ctx = a.propagator.Extract(ctx, r.Header.Get)
	}
	method := spanMethod(r.Method)
	name := pattern
	switch {
	case pattern == "" && method == "_OTHER":
		name = "HTTP"
	case pattern == "":
		name = method
	case !strings.Contains(pattern, " "):
		name = method + " " + pattern // a pattern without a method
	}
	ctx, span := observe.StartKind(ctx, a.tracer, observe.KindServer, name, observe.String("http.request.method", method))
	return r.WithContext(ctx), span
}

// endServerSpan ends span, the server span of a request that pattern
// routed ("" for none) and whose answer was status (0: none, the handler
// aborted): a 5xx or a panic marks it failed.
func endServerSpan(span observe.Span, pattern string, status int, panicked any) {
	var attrs []observe.Attr
	if status > 0 {
		attrs = append(attrs, observe.Int("http.response.status_code", status))
	}
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		// The path template: the method is http.request.method, as on
		// idem.http.request.
		attrs = append(attrs, observe.String("http.route", pattern[i:]))
	}
	span.SetAttributes(attrs...)
	switch {
	case panicked != nil:
		span.RecordError(fmt.Errorf("handler panic: %v", panicked))
	case status >= 500:
		span.RecordError(errors.New(strconv.Itoa(status) + " " + http.StatusText(status)))
	}
	span.End()
}

// spanMethod is method, or "_OTHER" for one that RFC 9110 and RFC 5789 do
// not define: a client's made-up methods must not name spans.
func spanMethod(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return method
	}
	return "_OTHER"
}
