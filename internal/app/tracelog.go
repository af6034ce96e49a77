package app

import (
	"context"
	"log/slog"

	"github.com/idemkit/idem/observe"
)

// traceHandler adds trace_id and span_id, the W3C trace and span IDs of
// the current span of a record's context, to the records logged with one
// (the Context variants: InfoContext, LogAttrs, ...), so that an operator
// goes from a log line to its trace. It reads the span through the
// Propagator, the one way observe has to see into a context: New installs
// it when telemetry is on, and only then.
type traceHandler struct {
	slog.Handler
	p observe.Propagator
}

// withTraceIDs returns log with trace_id and span_id added from the span
// of each record's context (log itself when p is nil).
func withTraceIDs(log *slog.Logger, p observe.Propagator) *slog.Logger {
	if p == nil {
		return log
	}
	return slog.New(traceHandler{log.Handler(), p})
}

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		var tp string
		h.p.Inject(ctx, func(k, v string) {
			if k == observe.TraceParent {
				tp = v
			}
		})
		// TraceID checks the layout: the parent-id (the span) follows the
		// version and the trace-id, "vv-<32 hex>-<16 hex>-...".
		if id := observe.TraceID(tp); id != "" {
			r = r.Clone()
			r.AddAttrs(slog.String("trace_id", id), slog.String("span_id", tp[36:52]))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs), h.p}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name), h.p}
}
