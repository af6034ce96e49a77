package observe

import (
	"context"
	"strings"
	"sync/atomic"
)

// W3C trace-context header names, as Propagator implementations read and
// write them and as they travel in event.Envelope.Headers.
const (
	TraceParent = "traceparent"
	TraceState  = "tracestate"
)

// Attr is one span attribute. Value is a string, bool, int, int64 or
// float64 (the constructors below make sure of it); an implementation may
// render any other type with fmt.
type Attr struct {
	Key   string
	Value any
}

// String returns a string attribute.
func String(k, v string) Attr { return Attr{Key: k, Value: v} }

// Int returns an integer attribute.
func Int(k string, v int) Attr { return Attr{Key: k, Value: int64(v)} }

// Bool returns a boolean attribute.
func Bool(k string, v bool) Attr { return Attr{Key: k, Value: v} }

// Tracer starts spans. Start returns ctx with the new span as its current
// span, so that the spans started from the returned context are its
// children.
type Tracer interface {
	Start(ctx context.Context, name string, attrs ...Attr) (context.Context, Span)
}

// Span is a started span. It must be ended exactly once; it is not used
// after End.
type Span interface {
	SetAttributes(attrs ...Attr)
	// AddLink links the span to the current span of ctx (a context
	// returned by Tracer.Start or Propagator.Extract); a ctx without one
	// adds no link.
	AddLink(ctx context.Context)
	// RecordError records err and marks the span failed.
	RecordError(err error)
	End()
}

// Propagator carries the trace context across a process boundary as text
// headers: the W3C traceparent and tracestate.
type Propagator interface {
	// Inject calls set for each header that carries the trace context of
	// ctx; nothing when ctx has none.
	Inject(ctx context.Context, set func(key, value string))
	// Extract returns ctx with the trace context read through get as its
	// remote parent: the spans started from the result are its children.
	// ctx is returned unchanged when get finds no valid trace context.
	Extract(ctx context.Context, get func(key string) string) context.Context
}

// Noop is a Tracer whose spans do nothing. Components treat a nil Tracer
// as Noop, without calling it.
var Noop Tracer = noopTracer{}

type noopTracer struct{}

func (noopTracer) Start(ctx context.Context, _ string, _ ...Attr) (context.Context, Span) {
	return ctx, NoopSpan
}

// NoopSpan is a Span that does nothing.
var NoopSpan Span = noopSpan{}

type noopSpan struct{}

func (noopSpan) SetAttributes(...Attr)   {}
func (noopSpan) AddLink(context.Context) {}
func (noopSpan) RecordError(error)       {}
func (noopSpan) End()                    {}

// Start starts a span with t, or returns ctx and NoopSpan when t is nil
// (without allocating).
func Start(ctx context.Context, t Tracer, name string, attrs ...Attr) (context.Context, Span) {
	if t == nil {
		return ctx, NoopSpan
	}
	return t.Start(ctx, name, attrs...)
}

// Kind is the role of a span in a trace, as OpenTelemetry's span kinds.
// Spans started with Start are internal.
type Kind int

// The span kinds.
const (
	KindInternal Kind = iota
	// KindServer: the span of a request served (an HTTP server's).
	KindServer
	// KindClient: the span of a request sent.
	KindClient
	// KindProducer: the span that hands a message to a broker.
	KindProducer
	// KindConsumer: the span that processes a message received.
	KindConsumer
)

// KindTracer is a Tracer that also starts spans of a given kind; trace
// backends build their service maps and request metrics from server,
// client, producer and consumer spans.
type KindTracer interface {
	Tracer
	StartKind(ctx context.Context, kind Kind, name string, attrs ...Attr) (context.Context, Span)
}

// StartKind starts a span of kind with t when it is a KindTracer, an
// internal one otherwise (Start), and returns ctx and NoopSpan when t is
// nil.
func StartKind(ctx context.Context, t Tracer, kind Kind, name string, attrs ...Attr) (context.Context, Span) {
	if kt, ok := t.(KindTracer); ok {
		return kt.StartKind(ctx, kind, name, attrs...)
	}
	return Start(ctx, t, name, attrs...)
}

// End records err on s if it is not nil, then ends s.
func End(s Span, err error) {
	if err != nil {
		s.RecordError(err)
	}
	s.End()
}

type defaults struct {
	tracer     Tracer
	propagator Propagator
}

var current atomic.Pointer[defaults]

// SetDefault registers the process-wide Tracer and Propagator, as
// otel.SetTracerProvider and otel.SetTextMapPropagator do for
// OpenTelemetry: idemotel.Install calls it once at start-up. Either may be
// nil (nothing traced, or no trace context carried). The defaults serve
// the code that takes no configuration: outbox.EnqueueTx (the
// idem.outbox.enqueue span and the trace context stored with the events),
// and the relay and inbox, which read events' trace context with the
// default Propagator. Components configured with a nil Tracer still trace
// nothing.
func SetDefault(t Tracer, p Propagator) {
	current.Store(&defaults{tracer: t, propagator: p})
}

// DefaultTracer returns the Tracer registered with SetDefault, or nil.
func DefaultTracer() Tracer {
	if d := current.Load(); d != nil {
		return d.tracer
	}
	return nil
}

// DefaultPropagator returns the Propagator registered with SetDefault, or
// nil.
func DefaultPropagator() Propagator {
	if d := current.Load(); d != nil {
		return d.propagator
	}
	return nil
}

// TraceID returns the trace-id field of a W3C traceparent value
// ("00-<trace-id>-<parent-id>-<flags>"), or "" when it is malformed: a
// field not of its length in lower-case hexadecimal, an all-zero trace-id
// or parent-id, version ff, or a version 00 value with more fields.
func TraceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) < 4 || !isHex(parts[0], 2) || parts[0] == "ff" || (parts[0] == "00" && len(parts) != 4) ||
		!isHex(parts[1], 32) || !isHex(parts[2], 16) || !isHex(parts[3], 2) ||
		parts[1] == strings.Repeat("0", 32) || parts[2] == strings.Repeat("0", 16) {
		return ""
	}
	return parts[1]
}

// isHex reports whether s is n lower-case hexadecimal digits.
func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// StartBatch starts the span name for a batch of n messages whose trace
// context is read, for message i, through header(i, key) (nil when the
// messages carry none). A traceparent that p does not extract (Extract
// returns ctx unchanged) counts as none. When every message that has a
// traceparent belongs to one trace, the span continues it as a child of
// the first message's producer span; otherwise it is a child of ctx.
// Either way, it links to the producer span of every message that has one
// (once per distinct traceparent). With a nil t it returns ctx and
// NoopSpan; with a nil p it reads no trace context. The span is of kind
// when t is a KindTracer (StartKind): KindConsumer for a batch received
// and processed, KindClient for one sent whose own context the messages do
// not carry.
func StartBatch(ctx context.Context, t Tracer, kind Kind, p Propagator, name string, n int, header func(i int, key string) string, attrs ...Attr) (context.Context, Span) {
	if t == nil {
		return ctx, NoopSpan
	}
	if p == nil || header == nil {
		return StartKind(ctx, t, kind, name, attrs...)
	}
	var (
		links   []context.Context
		seen    map[string]bool
		traceID string
		mixed   bool
	)
	for i := range n {
		tp := header(i, TraceParent)
		id := TraceID(tp)
		if id == "" || seen[tp] {
			continue
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[tp] = true
		ectx := p.Extract(ctx, func(k string) string { return header(i, k) })
		if ectx == ctx {
			// The propagator found no trace context it accepts (OpenTelemetry
			// refuses some values TraceID lets through): none, as if absent.
			continue
		}
		switch {
		case traceID == "":
			traceID = id
		case id != traceID:
			mixed = true
		}
		links = append(links, ectx)
	}
	parent := ctx
	if len(links) > 0 && !mixed {
		parent = links[0]
	}
	sctx, span := StartKind(parent, t, kind, name, attrs...)
	for _, l := range links {
		span.AddLink(l)
	}
	return sctx, span
}
