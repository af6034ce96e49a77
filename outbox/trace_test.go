package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/observe/observetest"
	"github.com/idemkit/idem/outbox"
)

// Not parallel: it sets observe's process-wide default.
func TestEnqueueStoresTraceContext(t *testing.T) {
	rec := &observetest.Recorder{}
	observe.SetDefault(rec, observetest.Propagator{})
	defer observe.SetDefault(nil, nil)

	drv := testdb.SQLite(t)
	ctx, req := rec.Start(t.Context(), "request")
	plain := mustEvent(t, "k1")
	own := mustEvent(t, "k2")
	ownHeaders := map[string]string{observe.TraceParent: "00-5bf92f3577b34da6a3ce929d0e0e4736-10f067aa0ba902b7-01", "tenant": "t1"}
	own.Headers = ownHeaders
	tenant := mustEvent(t, "k3")
	tenantHeaders := map[string]string{"tenant": "t2"}
	tenant.Headers = tenantHeaders
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, plain, own, tenant); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	req.End()
	if len(tenantHeaders) != 1 {
		t.Errorf("EnqueueTx modified the caller's Headers: %v", tenantHeaders)
	}
	enq := rec.Named("idem.outbox.enqueue")
	if len(enq) != 1 || !enq[0].Ended() || enq[0].Parent != req.(*observetest.Span).SpanContext || enq[0].Attr("idem.events") != int64(3) {
		t.Fatalf("enqueue spans %+v; want one child of the request with idem.events=3", enq)
	}
	want := enq[0].Traceparent()

	var (
		mu        sync.Mutex
		published []event.Envelope
	)
	pub := outbox.PublisherFunc(func(_ context.Context, evs []event.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		published = append(published, evs...)
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{Tracer: rec})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(t.Context()); err != nil || n != 3 {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	got := map[string]map[string]string{}
	for _, e := range published {
		got[e.Key] = e.Headers
	}
	if got["k1"][observe.TraceParent] != want {
		t.Errorf("k1 headers %v; want traceparent %s", got["k1"], want)
	}
	if got["k2"][observe.TraceParent] != ownHeaders[observe.TraceParent] {
		t.Errorf("k2 headers %v; the caller's traceparent must win", got["k2"])
	}
	if got["k3"][observe.TraceParent] != want || got["k3"]["tenant"] != "t2" {
		t.Errorf("k3 headers %v; want the trace context beside the tenant", got["k3"])
	}
	// The batch mixes two traces: a root of its own, linked to both.
	batches := rec.Named("idem.outbox.relay.batch")
	if len(batches) != 1 || !batches[0].Ended() {
		t.Fatalf("relay batch spans %v", batches)
	}
	b := batches[0]
	if len(b.Links) != 2 || b.Attr("idem.published") != int64(3) || b.Attr("idem.events") != int64(3) {
		t.Errorf("relay batch links %v, published %v; want 2 links, 3 published", b.Links, b.Attr("idem.published"))
	}
	if b.TraceID == enq[0].TraceID {
		t.Errorf("a batch of two traces continued one of them")
	}
}

func TestEnqueueWithoutPropagatorAddsNothing(t *testing.T) {
	drv := testdb.SQLite(t)
	e := mustEvent(t, "k1")
	enqueue(t, drv, e)
	var got []event.Envelope
	relay, err := outbox.NewRelay(drv, outbox.PublisherFunc(func(_ context.Context, evs []event.Envelope) error {
		got = append(got, evs...)
		return nil
	}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].Headers) != 0 {
		t.Errorf("published %v; want one event without headers", got)
	}
}

// A publisher that panics: the panic goes on, and the relay's batch span is
// ended with the panic as its error, not as a round that went well.
func TestRelayBatchSpanOnPublisherPanic(t *testing.T) {
	drv := testdb.SQLite(t)
	enqueue(t, drv, mustEvent(t, "k1"))
	rec := &observetest.Recorder{}
	relay, err := outbox.NewRelay(drv, outbox.PublisherFunc(func(context.Context, []event.Envelope) error { panic("boom") }),
		&outbox.RelayConfig{Tracer: rec})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v; want the publisher's panic", r)
			}
		}()
		_, _ = relay.RunOnce(t.Context())
	}()
	batches := rec.Named("idem.outbox.relay.batch")
	if len(batches) != 1 {
		t.Fatalf("%d relay batch spans; want 1", len(batches))
	}
	if b := batches[0]; !b.Ended() || b.Err() == nil {
		t.Errorf("relay batch span: ended %v, error %v; want ended with the panic", b.Ended(), b.Err())
	}
}

// panickyInsertDriver is a real driver whose outbox insert panics, as a
// driver's bug would.
type panickyInsertDriver struct{ driver.Driver[*sql.Tx] }

func (panickyInsertDriver) OutboxTx(*sql.Tx) driver.OutboxExecutor { panic("driver bug") }

// EnqueueTx whose driver panics: the panic goes on, and the
// idem.outbox.enqueue span is ended with it as its error, as the relay's,
// the inbox's and the middleware's spans are, not as an enqueue that went
// well.
// Not parallel: it sets observe's process-wide default.
func TestEnqueueSpanOnPanic(t *testing.T) {
	rec := &observetest.Recorder{}
	observe.SetDefault(rec, observetest.Propagator{})
	defer observe.SetDefault(nil, nil)
	drv := panickyInsertDriver{testdb.SQLite(t)}
	tx, err := drv.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = drv.Rollback(t.Context(), tx) }()
	func() {
		defer func() {
			if r := recover(); r != "driver bug" {
				t.Errorf("recovered %v; want the driver's panic", r)
			}
		}()
		_ = outbox.EnqueueTx(t.Context(), drv, tx, mustEvent(t, "k1"))
	}()
	enq := rec.Named("idem.outbox.enqueue")
	if len(enq) != 1 || !enq[0].Ended() || enq[0].Err() == nil || !strings.Contains(enq[0].Err().Error(), "driver bug") {
		t.Fatalf("enqueue spans %+v; want one, ended with the panic as its error", enq)
	}
}
