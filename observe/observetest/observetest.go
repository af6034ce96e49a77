// Package observetest has an in-memory observe.Tracer that records its
// spans and a W3C traceparent Propagator for it, to test tracing without
// OpenTelemetry.
package observetest

import (
	"context"
	"fmt"
	"sync"

	"github.com/idemkit/idem/observe"
)

// SpanContext identifies a span: hexadecimal W3C trace and span IDs.
type SpanContext struct {
	TraceID, SpanID string
}

// Traceparent returns sc as a W3C traceparent value.
func (sc SpanContext) Traceparent() string { return "00-" + sc.TraceID + "-" + sc.SpanID + "-01" }

type ctxKey struct{}

// FromContext returns the current span context of ctx (a span of the
// Recorder, or one extracted by Propagator).
func FromContext(ctx context.Context) (SpanContext, bool) {
	sc, ok := ctx.Value(ctxKey{}).(SpanContext)
	return sc, ok
}

// Span is a recorded span.
type Span struct {
	Name string
	SpanContext
	// Parent is the parent span's context; zero for a root span.
	Parent SpanContext
	Links  []SpanContext

	mu    sync.Mutex
	attrs map[string]any
	err   error
	ended bool
}

// Attr returns the value of attribute k.
func (s *Span) Attr(k string) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attrs[k]
}

// Ended reports whether End was called.
func (s *Span) Ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// Err is the error recorded on the span.
func (s *Span) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Span) SetAttributes(attrs ...observe.Attr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range attrs {
		s.attrs[a.Key] = a.Value
	}
}

func (s *Span) AddLink(ctx context.Context) {
	if sc, ok := FromContext(ctx); ok {
		s.mu.Lock()
		s.Links = append(s.Links, sc)
		s.mu.Unlock()
	}
}

func (s *Span) RecordError(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

func (s *Span) End() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
}

// Recorder is an observe.Tracer that records every span it starts.
type Recorder struct {
	mu    sync.Mutex
	n     int
	spans []*Span
}

// Start starts a span: a child of ctx's current span, or a root in a new
// trace.
func (r *Recorder) Start(ctx context.Context, name string, attrs ...observe.Attr) (context.Context, observe.Span) {
	r.mu.Lock()
	r.n++
	n := r.n
	r.mu.Unlock()
	s := &Span{Name: name, attrs: map[string]any{}}
	if p, ok := FromContext(ctx); ok {
		s.Parent = p
		s.TraceID = p.TraceID
	} else {
		s.TraceID = fmt.Sprintf("%032x", n)
	}
	s.SpanID = fmt.Sprintf("%016x", n)
	s.SetAttributes(attrs...)
	r.mu.Lock()
	r.spans = append(r.spans, s)
	r.mu.Unlock()
	return context.WithValue(ctx, ctxKey{}, s.SpanContext), s
}

// Spans returns the spans started so far, in start order.
func (r *Recorder) Spans() []*Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Span(nil), r.spans...)
}

// Named returns the spans named name, in start order.
func (r *Recorder) Named(name string) []*Span {
	var out []*Span
	for _, s := range r.Spans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// Propagator carries the span contexts of FromContext as W3C traceparent
// headers.
type Propagator struct{}

func (Propagator) Inject(ctx context.Context, set func(k, v string)) {
	if sc, ok := FromContext(ctx); ok {
		set(observe.TraceParent, sc.Traceparent())
	}
}

func (Propagator) Extract(ctx context.Context, get func(k string) string) context.Context {
	tp := get(observe.TraceParent)
	id := observe.TraceID(tp)
	if id == "" {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, SpanContext{TraceID: id, SpanID: tp[36:52]})
}
