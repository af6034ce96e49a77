package idemotel

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/observe"
)

// ScopeName is the instrumentation scope of idem's spans.
const ScopeName = "github.com/idemkit/idem"

// NewTracer returns an observe.Tracer whose spans are OpenTelemetry spans
// of tp (otel.GetTracerProvider() when tp is nil), in the instrumentation
// scope ScopeName.
func NewTracer(tp trace.TracerProvider) observe.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tracer{t: tp.Tracer(ScopeName)}
}

type tracer struct{ t trace.Tracer }

func (t tracer) Start(ctx context.Context, name string, attrs ...observe.Attr) (context.Context, observe.Span) {
	ctx, s := t.t.Start(ctx, name, trace.WithAttributes(convert(attrs)...))
	return ctx, span{s: s}
}

// StartKind starts a span of the OpenTelemetry kind of kind.
func (t tracer) StartKind(ctx context.Context, kind observe.Kind, name string, attrs ...observe.Attr) (context.Context, observe.Span) {
	ctx, s := t.t.Start(ctx, name, trace.WithAttributes(convert(attrs)...), trace.WithSpanKind(spanKind(kind)))
	return ctx, span{s: s}
}

// spanKind is OpenTelemetry's kind of kind.
func spanKind(kind observe.Kind) trace.SpanKind {
	switch kind {
	case observe.KindServer:
		return trace.SpanKindServer
	case observe.KindClient:
		return trace.SpanKindClient
	case observe.KindProducer:
		return trace.SpanKindProducer
	case observe.KindConsumer:
		return trace.SpanKindConsumer
	}
	return trace.SpanKindInternal
}

type span struct{ s trace.Span }

func (s span) SetAttributes(attrs ...observe.Attr) { s.s.SetAttributes(convert(attrs)...) }

func (s span) AddLink(ctx context.Context) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		s.s.AddLink(trace.Link{SpanContext: sc})
	}
}

func (s span) RecordError(err error) {
	if err == nil {
		return // as OpenTelemetry's RecordError: nothing to record
	}
	s.s.RecordError(err)
	s.s.SetStatus(codes.Error, err.Error())
}

func (s span) End() { s.s.End() }

func convert(attrs []observe.Attr) []attribute.KeyValue {
	if len(attrs) == 0 {
		return nil
	}
	kvs := make([]attribute.KeyValue, len(attrs))
	for i, a := range attrs {
		switch v := a.Value.(type) {
		case string:
			kvs[i] = attribute.String(a.Key, v)
		case bool:
			kvs[i] = attribute.Bool(a.Key, v)
		case int:
			kvs[i] = attribute.Int(a.Key, v)
		case int64:
			kvs[i] = attribute.Int64(a.Key, v)
		case float64:
			kvs[i] = attribute.Float64(a.Key, v)
		default:
			kvs[i] = attribute.String(a.Key, fmt.Sprint(v))
		}
	}
	return kvs
}

// Propagator returns an observe.Propagator over p; a nil p is the W3C
// trace context (traceparent, tracestate).
func Propagator(p propagation.TextMapPropagator) observe.Propagator {
	if p == nil {
		p = propagation.TraceContext{}
	}
	return propagator{p: p}
}

type propagator struct{ p propagation.TextMapPropagator }

func (p propagator) Inject(ctx context.Context, set func(k, v string)) {
	p.p.Inject(ctx, setCarrier(set))
}

func (p propagator) Extract(ctx context.Context, get func(k string) string) context.Context {
	return p.p.Extract(ctx, getCarrier(get))
}

// setCarrier and getCarrier adapt the observe callbacks to
// propagation.TextMapCarrier.
type setCarrier func(k, v string)

func (setCarrier) Get(string) string { return "" }
func (c setCarrier) Set(k, v string) { c(k, v) }
func (setCarrier) Keys() []string    { return nil }

type getCarrier func(k string) string

func (c getCarrier) Get(k string) string { return c(k) }
func (getCarrier) Set(string, string)    {}
func (getCarrier) Keys() []string        { return []string{observe.TraceParent, observe.TraceState} }

// Install registers NewTracer(tp) and Propagator(p) as observe's defaults
// (observe.SetDefault) and returns the Tracer, to set in the components'
// configurations. Call it once at start-up, before enqueueing events.
func Install(tp trace.TracerProvider, p propagation.TextMapPropagator) observe.Tracer {
	t := NewTracer(tp)
	observe.SetDefault(t, Propagator(p))
	return t
}
