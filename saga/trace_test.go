package saga_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/observe/observetest"
	"github.com/idemkit/idem/saga"
)

// A step that panics: the panic goes on, and its idem.saga.step span is
// ended with the panic as its error, not as a step that succeeded.
func testStepPanicSpan[TTx any](t *testing.T, f *fixture[TTx]) {
	rec := &observetest.Recorder{}
	c := f.coordinator(t, &saga.Config{CompensationBackoff: time.Millisecond, Tracer: rec})
	id := newSagaID(t)
	f.start(t, c, id)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v; want the step's panic", r)
			}
		}()
		_, _, _ = c.Step(t.Context(), id, "step-1", func(context.Context, TTx) ([]byte, error) { panic("boom") })
	}()
	spans := rec.Named("idem.saga.step")
	if len(spans) != 1 {
		t.Fatalf("%d idem.saga.step spans; want 1", len(spans))
	}
	if s := spans[0]; !s.Ended() || s.Err() == nil {
		t.Errorf("span of the panicking step: ended %v, error %v; want ended with the panic", s.Ended(), s.Err())
	}
}
