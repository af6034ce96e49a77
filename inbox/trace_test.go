package inbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/observe/observetest"
)

// A handler that panics: the panic goes on, and every span of the call is
// ended, with the panic as its error (not left open, not ended as a
// success).
func TestSpansEndedOnHandlerPanic(t *testing.T) {
	t.Parallel()
	f := setupSQLite(t)
	for _, op := range []string{"ProcessBatch", "Process", "ProcessBulk"} {
		t.Run(op, func(t *testing.T) {
			rec := &observetest.Recorder{}
			ib, err := inbox.New(f.drv, &inbox.Config{Consumer: "c-" + op, Tracer: rec})
			if err != nil {
				t.Fatal(err)
			}
			id, err := event.NewID()
			if err != nil {
				t.Fatal(err)
			}
			func() {
				defer func() {
					if recover() == nil {
						t.Fatalf("%s did not panic", op)
					}
				}()
				ctx := context.Background()
				switch op {
				case "ProcessBatch":
					_, _ = ib.ProcessBatch(ctx, []inbox.Event{{ID: id}}, func(context.Context, *sql.Tx, inbox.Event) error { panic("boom") })
				case "Process":
					_, _ = ib.Process(ctx, id, func(context.Context, *sql.Tx) error { panic("boom") })
				case "ProcessBulk":
					_, _ = ib.ProcessBulk(ctx, []inbox.Event{{ID: id}}, func(context.Context, *sql.Tx, []inbox.Event) error { panic("boom") })
				}
			}()
			spans := rec.Spans()
			if len(spans) == 0 {
				t.Fatal("no span recorded")
			}
			for _, s := range spans {
				if !s.Ended() {
					t.Errorf("span %s never ended after the handler panicked", s.Name)
				} else if s.Err() == nil || !strings.Contains(s.Err().Error(), "boom") {
					t.Errorf("span %s ended with error %v; want the panic", s.Name, s.Err())
				}
			}
		})
	}
}
