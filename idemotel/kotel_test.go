package idemotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/outbox"
)

// Two requests enqueue an event each; one relay round publishes both
// through a Publisher whose client carries franz-go's kotel hooks, and a
// consumer with kotel's hooks reads them. kotel's producer hook injects the
// context of its publish span into the record, over the traceparent the
// relay took from the outbox row: that span must continue the request's
// trace (a child of the idem.outbox.enqueue span), not the relay's (a
// batch of two traces is a trace of its own, and a relay without a Tracer
// has none), or each consumer would continue the wrong trace.
//
// Not parallel: it sets observe's process-wide default.
func TestKotelHooksKeepTheRequestsTrace(t *testing.T) {
	for _, tc := range []struct {
		name        string
		relayTraced bool
	}{
		{"relay traced", true},
		{"relay untraced", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			tracer := idemotel.Install(tp, nil)
			t.Cleanup(func() { observe.SetDefault(nil, nil) })
			prop := kotel.TracerPropagator(propagation.TraceContext{})

			drv := testdb.SQLite(t)
			reqs := map[string]trace.SpanContext{} // event key -> its request's span
			for _, key := range []string{"order-a", "order-b"} {
				ctx, req := tp.Tracer("app").Start(t.Context(), "POST /orders")
				e, err := event.New("OrderCreated.v1", key, map[string]string{"id": key})
				if err != nil {
					t.Fatal(err)
				}
				tx, err := drv.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := outbox.EnqueueTx(ctx, drv, tx, e); err != nil {
					t.Fatalf("EnqueueTx: %v", err)
				}
				if err := drv.Commit(ctx, tx); err != nil {
					t.Fatal(err)
				}
				req.End()
				reqs[key] = req.SpanContext()
			}
			enqueue := map[trace.TraceID]trace.SpanContext{} // request trace -> its idem.outbox.enqueue span
			for _, s := range rec.Ended() {
				if s.Name() == "idem.outbox.enqueue" {
					enqueue[s.SpanContext().TraceID()] = s.SpanContext()
				}
			}

			kc := kafkatest.New(t)
			topic := kc.Topic(t, "orders", 1)
			producerHooks := kotel.NewKotel(kotel.WithTracer(kotel.NewTracer(kotel.TracerProvider(tp), prop))).Hooks()
			pub, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{
				Seeds:        kc.Seeds,
				DefaultTopic: topic,
				ExtraOpts:    []kgo.Opt{kgo.WithHooks(producerHooks...)},
			})
			if err != nil {
				t.Fatalf("NewPublisher: %v", err)
			}
			t.Cleanup(pub.Close)
			cfg := &outbox.RelayConfig{}
			if tc.relayTraced {
				cfg.Tracer = tracer
			}
			relay, err := outbox.NewRelay(drv, pub, cfg)
			if err != nil {
				t.Fatalf("NewRelay: %v", err)
			}
			if n, err := relay.RunOnce(t.Context()); err != nil || n != 2 {
				t.Fatalf("RunOnce = %d, %v; want both events in one round", n, err)
			}

			consumerHooks := kotel.NewKotel(kotel.WithTracer(kotel.NewTracer(kotel.TracerProvider(tp), prop))).Hooks()
			cl := kc.Client(t,
				kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
				kgo.FetchMaxWait(100*time.Millisecond),
				kgo.WithHooks(consumerHooks...))
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var records []*kgo.Record
			for len(records) < 2 {
				fs := cl.PollFetches(ctx)
				if err := ctx.Err(); err != nil {
					t.Fatalf("read %d of 2 records: %v", len(records), err)
				}
				fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
				records = append(records, fs.Records()...)
			}

			publish := map[trace.SpanID]sdktrace.ReadOnlySpan{}
			for _, s := range rec.Ended() {
				if s.Name() == topic+" publish" {
					publish[s.SpanContext().SpanID()] = s
				}
			}
			for _, r := range records {
				key := string(r.Key)
				want := reqs[key].TraceID()
				var tps []string
				for _, h := range r.Headers {
					if h.Key == observe.TraceParent {
						tps = append(tps, string(h.Value))
					}
				}
				if len(tps) != 1 {
					t.Fatalf("%s: traceparent headers %q; want one", key, tps)
				}
				if got := observe.TraceID(tps[0]); got != want.String() {
					t.Errorf("%s: the record's traceparent %s is of trace %s; want the request's trace %s", key, tps[0], got, want)
				}
				// The consumer's span (kotel's receive span) continues it.
				if got := trace.SpanContextFromContext(r.Context).TraceID(); got != want {
					t.Errorf("%s: the consumer's span is in trace %s; want the request's trace %s", key, got, want)
				}
				// kotel's publish span sits between the enqueue span and the
				// consumer.
				parent, err := trace.SpanIDFromHex(tps[0][36:52])
				if err != nil {
					t.Fatalf("%s: traceparent %s: %v", key, tps[0], err)
				}
				s, ok := publish[parent]
				if !ok {
					t.Errorf("%s: the record's traceparent %s names no kotel publish span", key, tps[0])
					continue
				}
				if s.Parent().SpanID() != enqueue[want].SpanID() {
					t.Errorf("%s: kotel's publish span is a child of %s; want the idem.outbox.enqueue span %s", key, s.Parent().SpanID(), enqueue[want].SpanID())
				}
			}
		})
	}
}
