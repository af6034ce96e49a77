package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/observe/observetest"
	"github.com/idemkit/idem/outbox"
)

// spanLogHandler records, for each line, the span of the context it was
// logged with (zero for none).
type spanLogHandler struct {
	mu    *sync.Mutex
	spans map[string]observetest.SpanContext
}

func (h spanLogHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h spanLogHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h spanLogHandler) WithGroup(string) slog.Handler            { return h }
func (h spanLogHandler) Handle(ctx context.Context, r slog.Record) error {
	sc, _ := observetest.FromContext(ctx)
	h.mu.Lock()
	h.spans[r.Message] = sc
	h.mu.Unlock()
	return nil
}

// The lines about a round's events (parked, failed) are logged in the
// context of its idem.outbox.relay.batch span, which continues the events'
// trace: a handler that adds the span's IDs leads from the line to the
// trace of the request that enqueued them.
func TestRoundLinesLoggedInBatchSpan(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	tx, err := drv.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(t.Context(), drv, tx, mustEvent(t, "poison"), mustEvent(t, "fails")); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	pub := outbox.PublisherFunc(func(_ context.Context, evs []event.Envelope) error {
		errs := make([]error, len(evs))
		for i, e := range evs {
			if e.Key == "poison" {
				errs[i] = fmt.Errorf("%w: too large", outbox.ErrPoison)
			} else {
				errs[i] = errors.New("broker down")
			}
		}
		return &outbox.PublishError{Errs: errs}
	})
	h := spanLogHandler{mu: &sync.Mutex{}, spans: map[string]observetest.SpanContext{}}
	rec := &observetest.Recorder{}
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{Tracer: rec, Logger: slog.New(h), MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = relay.RunOnce(t.Context())
	batches := rec.Named("idem.outbox.relay.batch")
	if len(batches) != 1 {
		t.Fatalf("%d relay batch spans; want 1", len(batches))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, msg := range []string{
		"outbox: event parked as poison; the later events of its key wait until it is unparked",
		"outbox: publish failed; the failed events and the later events of their keys wait for a retry",
	} {
		sc, logged := h.spans[msg]
		if !logged {
			t.Errorf("no %q line; lines: %v", msg, h.spans)
		} else if sc != batches[0].SpanContext {
			t.Errorf("%q logged in span %+v; want the batch span %+v", msg, sc, batches[0].SpanContext)
		}
	}
}
