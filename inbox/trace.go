package inbox

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/observe"
)

// startSpan starts the idem.inbox.batch span of one call with events; a
// no-op without Config.Tracer.
func (ib *Inbox[TTx]) startSpan(ctx context.Context, op string, events []Event) (context.Context, observe.Span) {
	if ib.cfg.Tracer == nil {
		return ctx, observe.NoopSpan
	}
	return observe.StartBatch(ctx, ib.cfg.Tracer, observe.KindConsumer, observe.DefaultPropagator(), "idem.inbox.batch", len(events),
		func(i int, k string) string { return events[i].Headers[k] },
		observe.String("idem.consumer", ib.cfg.Consumer),
		observe.String("idem.inbox.op", op),
		observe.Int("idem.events", len(events)))
}

// endSpan ends span with what the call did. Deferred, it ends the span of
// a call whose handler panicked too, with the panic as its error, and lets
// the panic go on.
func endSpan(span observe.Span, res *BatchResult, err *error) {
	if span == observe.NoopSpan {
		return
	}
	span.SetAttributes(observe.Int("idem.applied", res.Applied), observe.Int("idem.duplicates", res.Duplicates))
	if p := recover(); p != nil {
		observe.End(span, fmt.Errorf("panic: %v", p))
		panic(p)
	}
	observe.End(span, *err)
}

// traced wraps fn, ProcessBatch's handler, so that each new event is
// handled in an idem.inbox.handle span: a child of the event's producer
// span when it carries a trace context (the trace of the request that
// enqueued it goes on), of the batch span otherwise, and linked to the
// batch span. fn itself without Config.Tracer.
func (ib *Inbox[TTx]) traced(fn func(ctx context.Context, tx TTx, e Event) error) func(ctx context.Context, tx TTx, e Event) error {
	t := ib.cfg.Tracer
	if t == nil {
		return fn
	}
	return func(ctx context.Context, tx TTx, e Event) error {
		parent := ctx
		if p := observe.DefaultPropagator(); p != nil && observe.TraceID(e.Headers[observe.TraceParent]) != "" {
			parent = p.Extract(ctx, func(k string) string { return e.Headers[k] })
		}
		hctx, span := observe.StartKind(parent, t, observe.KindConsumer, "idem.inbox.handle", observe.String("idem.consumer", ib.cfg.Consumer))
		if parent != ctx {
			span.AddLink(ctx)
		}
		var err error
		defer func() {
			if p := recover(); p != nil {
				observe.End(span, fmt.Errorf("panic: %v", p))
				panic(p)
			}
			observe.End(span, err)
		}()
		err = fn(hctx, tx, e)
		return err
	}
}
