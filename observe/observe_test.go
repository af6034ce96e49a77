package observe_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/observe/observetest"
)

func TestNilTracerIsNoopAndAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		c, s := observe.Start(ctx, nil, "x")
		if c != ctx {
			t.Fatal("Start(nil tracer) changed the context")
		}
		observe.End(s, nil)
		c, s = observe.StartBatch(ctx, nil, observe.KindConsumer, nil, "batch", 3, nil)
		if c != ctx {
			t.Fatal("StartBatch(nil tracer) changed the context")
		}
		s.End()
	})
	if allocs != 0 {
		t.Errorf("no-op path allocates %v times; want 0", allocs)
	}
	// The no-op span accepts everything.
	_, s := observe.Noop.Start(ctx, "x", observe.String("a", "b"))
	s.SetAttributes(observe.Int("n", 1), observe.Bool("b", true))
	s.AddLink(ctx)
	s.RecordError(errors.New("boom"))
	s.End()
}

func TestDefault(t *testing.T) {
	defer observe.SetDefault(nil, nil)
	if observe.DefaultTracer() != nil || observe.DefaultPropagator() != nil {
		t.Fatal("defaults set before SetDefault")
	}
	rec := &observetest.Recorder{}
	observe.SetDefault(rec, observetest.Propagator{})
	if observe.DefaultTracer() != rec || observe.DefaultPropagator() == nil {
		t.Fatal("SetDefault not returned by DefaultTracer/DefaultPropagator")
	}
}

func TestTraceID(t *testing.T) {
	for tp, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "4bf92f3577b34da6a3ce929d0e0e4736",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01": "",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-01":                  "",
		// A malformed parent-id, flags or version makes the whole
		// header malformed (W3C trace context, 3.2.2).
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01":    "",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902zz-01":    "",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x":    "",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":    "",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx": "",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx": "4bf92f3577b34da6a3ce929d0e0e4736",
		"": "",
	} {
		if got := observe.TraceID(tp); got != want {
			t.Errorf("TraceID(%q) = %q, want %q", tp, got, want)
		}
	}
}

func TestStartBatch(t *testing.T) {
	rec := &observetest.Recorder{}
	ctx := context.Background()
	a := observetest.SpanContext{TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	a2 := observetest.SpanContext{TraceID: a.TraceID, SpanID: "00f067aa0ba902b8"}
	b := observetest.SpanContext{TraceID: "5bf92f3577b34da6a3ce929d0e0e4736", SpanID: "10f067aa0ba902b7"}
	batch := func(scs ...observetest.SpanContext) *observetest.Span {
		hs := make([]map[string]string, len(scs))
		for i, sc := range scs {
			if sc.TraceID != "" {
				hs[i] = map[string]string{observe.TraceParent: sc.Traceparent()}
			}
		}
		_, s := observe.StartBatch(ctx, rec, observe.KindConsumer, observetest.Propagator{}, "b", len(hs), func(i int, k string) string { return hs[i][k] })
		s.End()
		return s.(*observetest.Span)
	}

	// One trace: continued, as a child of the first event's span; one
	// link per distinct producer span.
	s := batch(a, observetest.SpanContext{}, a, a2)
	if s.TraceID != a.TraceID || s.Parent != a {
		t.Errorf("one-trace batch: trace %s parent %v; want a child of %v", s.TraceID, s.Parent, a)
	}
	if len(s.Links) != 2 || s.Links[0] != a || s.Links[1] != a2 {
		t.Errorf("links %v; want [%v %v]", s.Links, a, a2)
	}
	// Mixed traces: a trace of its own, linked to both.
	s = batch(a, b)
	if s.TraceID == a.TraceID || s.TraceID == b.TraceID || s.Parent != (observetest.SpanContext{}) {
		t.Errorf("mixed batch: trace %s parent %v; want a new root", s.TraceID, s.Parent)
	}
	if len(s.Links) != 2 {
		t.Errorf("mixed batch links %v; want 2", s.Links)
	}
	// A malformed traceparent (a zero parent-id) is no trace context: the
	// batch continues the trace of the valid one.
	bad := map[string]string{observe.TraceParent: "00-" + b.TraceID + "-0000000000000000-01"}
	hs := []map[string]string{bad, {observe.TraceParent: a.Traceparent()}}
	_, sp := observe.StartBatch(ctx, rec, observe.KindConsumer, observetest.Propagator{}, "b", len(hs), func(i int, k string) string { return hs[i][k] })
	sp.End()
	s = sp.(*observetest.Span)
	if s.TraceID != a.TraceID || s.Parent != a || len(s.Links) != 1 {
		t.Errorf("batch with a malformed traceparent: trace %s parent %v links %v; want a child of %v linked to it alone", s.TraceID, s.Parent, s.Links, a)
	}
	// No trace context: a plain span.
	s = batch(observetest.SpanContext{})
	if len(s.Links) != 0 || s.Parent != (observetest.SpanContext{}) {
		t.Errorf("batch without trace context: parent %v links %v", s.Parent, s.Links)
	}
}
